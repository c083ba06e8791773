"""Prometheus metrics. The names and labels are an interface: the promotion analysis queries them per version.

  arbiter_decisions_total{model,version,outcome,source}
      outcome: ok | low_confidence (model decided, confidence under the threshold, policy flag)
               | fallback (rules decided) | error (no decision could be made)
      source:  model | rules | none
  arbiter_decision_latency_seconds{model,version}      histogram, request arrival -> decision, per decision
  arbiter_schema_violations_total{model,version,kind}  every rejected model answer (schema, probabilities,
                                                        order, length, format, logprobs, json)
  arbiter_fallbacks_total{model,version,reason}        reason: upstream_down | upstream_error | deadline |
                                                        invalid | low_confidence
  arbiter_upstream_errors_total{model,version,kind}    kind: connect | timeout | http_5xx | http_4xx | protocol
  arbiter_upstream_up{model,version}                   1 while the upstream answers /health, else 0
  arbiter_audit_queue_depth{model,version}             audit records reserved or waiting for the writer
  arbiter_audit_refused_total{model,version}           requests refused (503) because the audit queue was full
  arbiter_audit_write_errors_total{model,version,sink} records a sink failed to take
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, model: str, version: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter("arbiter_decisions", "Decisions by outcome and source",
                                 ["model", "version", "outcome", "source"], registry=r)
        self.latency = Histogram("arbiter_decision_latency_seconds", "Time from request to decision",
                                 ["model", "version"], buckets=LATENCY_BUCKETS, registry=r)
        self.schema_violations = Counter("arbiter_schema_violations", "Model answers rejected by the checks",
                                         ["model", "version", "kind"], registry=r)
        self.fallbacks = Counter("arbiter_fallbacks", "Decisions handed to the rules engine, by reason",
                                 ["model", "version", "reason"], registry=r)
        self.upstream_errors = Counter("arbiter_upstream_errors", "Failed calls to the upstream model server",
                                       ["model", "version", "kind"], registry=r)
        self.upstream_up = Gauge("arbiter_upstream_up", "1 while the upstream answers its health check",
                                 ["model", "version"], registry=r).labels(model, version)
        self.audit_depth = Gauge("arbiter_audit_queue_depth", "Audit records reserved or waiting to be written",
                                 ["model", "version"], registry=r).labels(model, version)
        self.audit_refused = Counter("arbiter_audit_refused", "Requests refused because the audit queue was full",
                                     ["model", "version"], registry=r)
        self.audit_write_errors = Counter("arbiter_audit_write_errors", "Audit records a sink failed to take",
                                          ["model", "version", "sink"], registry=r)
        self.audit_refused.labels(model, version)
        self._mv = self.mv = (model, version)
        self._latency = self.latency.labels(model, version)
        # Pre-create the series the analysis divides by, so a ratio exists (as 0) before the first failure.
        for outcome, source in (("ok", "model"), ("low_confidence", "model"), ("fallback", "rules"),
                                ("error", "none")):
            self.decisions.labels(model, version, outcome, source)
        for reason in ("upstream_down", "upstream_error", "deadline", "invalid", "low_confidence"):
            self.fallbacks.labels(model, version, reason)
        self.schema_violations.labels(model, version, "schema")
        self.upstream_errors.labels(model, version, "connect")

    def decision(self, outcome: str, source: str, seconds: float) -> None:
        self.decisions.labels(*self._mv, outcome, source).inc()
        self._latency.observe(seconds)

    def violation(self, kind: str) -> None:
        self.schema_violations.labels(*self._mv, kind).inc()

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(*self._mv, reason).inc()

    def upstream_error(self, kind: str) -> None:
        self.upstream_errors.labels(*self._mv, kind).inc()
