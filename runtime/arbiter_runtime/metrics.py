"""Prometheus metrics. The names and labels are an interface: the promotion analysis queries them per version.

  arbiter_decisions_total{model,version,outcome,source}
      outcome: ok | low_confidence (model decided, confidence under the threshold, policy flag)
               | fallback (rules decided) | error (no decision could be made)
      source:  model | rules | none
  arbiter_decision_latency_seconds{model,version}      histogram, request arrival -> decision, per decision
  arbiter_decision_latency_objective_seconds{model,version}  the version's declared p95 latency (sla.p95LatencyMs)
  arbiter_decisions_over_objective_total{model,version}  decisions slower than that: the latency SLO's bad events
                                                        (the burn-rate alerts divide it by arbiter_decisions_total)
  arbiter_decision_labels_total{model,version,label}   every decision answered (HTTP 200), by its final label
                                                        (the model's or the rules'): the decision mix
  arbiter_schema_violations_total{model,version,kind}  every rejected model answer (one per attempt). kind
                                                        "inconsistent": the text names one label and the model's
                                                        own log-probabilities favour another; every other kind is a
                                                        schema/format violation (schema, probabilities, order,
                                                        length, format, logprobs, json)
  arbiter_fallbacks_total{model,version,reason}        reason: upstream_down | upstream_error | deadline |
                                                        invalid | low_confidence
  arbiter_upstream_errors_total{model,version,kind}    kind: connect | timeout | http_5xx | http_4xx | protocol |
                                                        too_large (an answer over the bound of its max_tokens) |
                                                        context_length (vLLM refused a prompt longer than its
                                                        --max-model-len leaves room for)
  arbiter_upstream_up{model,version}                   1 while the upstream answers /health, else 0
  arbiter_audit_queue_depth{model,version}             audit records reserved or waiting for the writer
  arbiter_audit_refused_total{model,version}           requests refused (503) because the audit queue was full
  arbiter_audit_write_errors_total{model,version,sink} records a sink failed to take
  Shadow (champion/challenger; recorded by the stable version's runtime that mirrors, shadow.py):
  arbiter_shadow_requests_total{model,version,candidate,result}
      result: sent (mirrored to the candidate) | dropped (sampled, but the in-flight bound or the audit queue said no)
              | error (the candidate failed, timed out or answered something unreadable) | compared
      every sent request ends as exactly one of error or compared
  arbiter_shadow_comparisons_total{model,version,candidate,stable_label,candidate_label,agree}
      one per compared row; candidate_label is "_other" when the candidate answered a label this version does not
      have; agree "true" | "false": the agreement rate and the per-label confusion
  arbiter_shadow_in_flight{model,version}              mirrored requests waiting for the candidate
  arbiter_shadow_config_errors_total{model,version}    shadow.json contents that could not be used (shadowing off)
  Context routing (spec.routing; routing.py), recorded by the version that forwards:
  arbiter_routed_requests_total{model,version,to,result}
      result: forwarded (the pinned version answered; its answer went back as it was) | error (it did not answer in
              time or at all: 503) | refused (no identity to pass on: 421) | loop (the routes disagree: 508)
      a forwarded request is counted by the version that decides it, never in this version's decisions
  arbiter_routing_config_errors_total{model,version}   routing.json contents that could not be used (no routes)
  vLLM's processes (vllm_processes.py), when the supervisor started vLLM:
  arbiter_vllm_process_cpu_seconds_total{model,version,process,index}
      process: api-server | engine-core | worker; a rate near 1 is the process that bounds the pod
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Every kind of rejected model answer the checks name (decide.py, trajectory.py, scored_format.py), pre-created at 0.
VIOLATION_KINDS = ("schema", "inconsistent", "probabilities", "order", "length", "format", "logprobs", "json")
SHADOW_RESULTS = ("sent", "dropped", "error", "compared")
ROUTED_RESULTS = ("forwarded", "error", "refused", "loop")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, model: str, version: str, registry: CollectorRegistry | None = None,
                 objective_seconds: float | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # A histogram bucket cannot stand for an arbitrary objective (3.2 s falls between 2.5 and 5), so the slow
        # decisions are counted against the objective itself: the SLO's ratio needs no interpolation.
        self.objective_seconds = objective_seconds
        self.over_objective = Counter("arbiter_decisions_over_objective", "Decisions slower than the version's "
                                      "declared p95 latency objective", ["model", "version"],
                                      registry=r).labels(model, version)
        if objective_seconds is not None:
            Gauge("arbiter_decision_latency_objective_seconds", "The version's declared p95 decision latency",
                  ["model", "version"], registry=r).labels(model, version).set(objective_seconds)
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
        self.decision_labels = Counter("arbiter_decision_labels", "Decisions answered, by final label (model or "
                                       "rules): the decision mix", ["model", "version", "label"], registry=r)
        self.shadow_requests = Counter("arbiter_shadow_requests", "Requests mirrored to a shadow candidate, by result",
                                       ["model", "version", "candidate", "result"], registry=r)
        self.shadow_comparisons = Counter("arbiter_shadow_comparisons", "Rows decided by both this version and the "
                                          "shadow candidate, by both labels",
                                          ["model", "version", "candidate", "stable_label", "candidate_label",
                                           "agree"], registry=r)
        self.shadow_in_flight = Gauge("arbiter_shadow_in_flight", "Mirrored requests waiting for the candidate",
                                      ["model", "version"], registry=r).labels(model, version)
        self.shadow_config_errors = Counter("arbiter_shadow_config_errors", "shadow.json contents that could not be "
                                            "used (shadowing is off until it is fixed)", ["model", "version"],
                                            registry=r).labels(model, version)
        self.routed_requests = Counter("arbiter_routed_requests", "Requests of a pinned context forwarded to the "
                                       "version that decides it, by result", ["model", "version", "to", "result"],
                                       registry=r)
        self.routing_config_errors = Counter("arbiter_routing_config_errors", "routing.json contents that could not "
                                             "be used (no context is routed until it is fixed)", ["model", "version"],
                                             registry=r).labels(model, version)
        self._labels: dict[str, Any] = {}
        self._mv = self.mv = (model, version)
        self._latency = self.latency.labels(model, version)
        # Pre-create the series the analysis divides by, so a ratio exists (as 0) before the first failure.
        for outcome, source in (("ok", "model"), ("low_confidence", "model"), ("fallback", "rules"),
                                ("error", "none")):
            self.decisions.labels(model, version, outcome, source)
        for reason in ("upstream_down", "upstream_error", "deadline", "invalid", "low_confidence"):
            self.fallbacks.labels(model, version, reason)
        for kind in VIOLATION_KINDS:
            self.schema_violations.labels(model, version, kind)
        self.upstream_errors.labels(model, version, "connect")

    def decision(self, outcome: str, source: str, seconds: float) -> None:
        self.decisions.labels(*self._mv, outcome, source).inc()
        self._latency.observe(seconds)
        if self.objective_seconds is not None and seconds > self.objective_seconds:
            self.over_objective.inc()

    def configure_labels(self, labels: tuple[str, ...] | list[str]) -> None:
        """Pre-create the decision-mix series at 0 for every configured label (a share exists before a decision)."""
        self._labels = {x: self.decision_labels.labels(*self._mv, x) for x in labels}

    def answered(self, label: str | None) -> None:
        counter = None if label is None else self._labels.get(label)
        if counter is None:  # a label the config does not list cannot be decided; kept out of the series anyway
            return
        counter.inc()

    def shadow_candidate(self, candidate: str, labels: tuple[str, ...] | list[str]) -> None:
        """Pre-create a candidate's series at 0, so its rates and agreement ratio exist from the first scrape."""
        for result in SHADOW_RESULTS:
            self.shadow_requests.labels(*self._mv, candidate, result)
        for stable in labels:
            for cand in labels:
                self.shadow_comparisons.labels(*self._mv, candidate, stable, cand, str(stable == cand).lower())

    def shadow_result(self, candidate: str, result: str) -> None:
        self.shadow_requests.labels(*self._mv, candidate, result).inc()

    def shadow_comparison(self, candidate: str, stable_label: str | None, candidate_label: str) -> bool:
        agree = stable_label == candidate_label
        self.shadow_comparisons.labels(*self._mv, candidate, stable_label, candidate_label,
                                       "true" if agree else "false").inc()
        return agree

    def routed_to(self, version: str) -> None:
        """Pre-create a pinned version's series at 0."""
        for result in ROUTED_RESULTS:
            self.routed_requests.labels(*self._mv, version, result)

    def routed(self, version: str, result: str) -> None:
        self.routed_requests.labels(*self._mv, version, result).inc()

    def violation(self, kind: str) -> None:
        self.schema_violations.labels(*self._mv, kind).inc()

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(*self._mv, reason).inc()

    def upstream_error(self, kind: str) -> None:
        self.upstream_errors.labels(*self._mv, kind).inc()
