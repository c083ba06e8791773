"""What diagnose knows about one DecisionModel: the object, its Events and predictor pods, and per version the numbers
its decision server and vLLM report, whichever way they were read (Prometheus over a window, or a decision server's
own /metrics and /metrics/vllm since it started). Plain data, plus the pure reading of a Prometheus text page into
those numbers; nothing here does I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class VersionMetrics:
    """One version's numbers. Counts are over `source`'s span; None: not reported (not the same as 0)."""

    version: str
    source: str  # where the numbers come from, for the report ("Prometheus, last 10m", "http://...: since start")
    decisions: dict[str, float] = field(default_factory=dict)  # outcome -> decisions
    fallbacks: dict[str, float] = field(default_factory=dict)  # reason -> decisions handed to the rules
    violations: dict[str, float] = field(default_factory=dict)  # kind -> rejected model answers
    upstream_errors: dict[str, float] = field(default_factory=dict)  # kind -> failed calls to vLLM
    upstream_up: float | None = None  # 1 while vLLM answers its health check (the lowest over pods and window)
    audit_refused: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    objective_s: float | None = None  # the version's declared p95 (sla.p95LatencyMs)
    # vLLM's own (re-exported by the decision server at /metrics/vllm)
    waiting: float | None = None  # requests waiting for a slot (the most seen)
    running: float | None = None
    kv_cache: float | None = None  # KV-cache use, 0..1 (the most seen)
    preemptions: float | None = None
    queue_p95_s: float | None = None
    prompt_tokens_p99: float | None = None
    prompt_tokens_max: float | None = None  # the largest prompt the histogram proves (its top filled bucket's floor)
    finished: dict[str, float] = field(default_factory=dict)  # finished_reason -> requests (stop, length, abort)
    # The busiest vLLM process of each kind (api-server, engine-core, worker), in cores over the window: a rate, so
    # Prometheus only (a decision server's page has the CPU seconds since the process started, not over a window).
    busiest_cores: dict[str, float] = field(default_factory=dict)
    vllm_read: bool = False  # whether vLLM's families were read at all

    @property
    def total(self) -> float:
        return sum(self.decisions.values())


@dataclass
class Evidence:
    namespace: str
    name: str
    dm: dict[str, Any] | None = None
    events: list[dict[str, Any]] | None = None  # None: not read (see unreadable)
    pods: list[dict[str, Any]] | None = None
    metrics: dict[str, VersionMetrics] = field(default_factory=dict)  # version -> numbers
    unreadable: list[str] = field(default_factory=list)  # what could not be read, and why
    read: list[str] = field(default_factory=list)  # what was read (the report's "sources")


# -- a Prometheus text page -> numbers -------------------------------------------------------------------------------


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of a text exposition; a page that does not parse gives what parsed before."""
    out: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(text):
            out += [(s.name, dict(s.labels), float(s.value)) for s in family.samples]
    except (ValueError, TypeError, IndexError):
        pass
    return out


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile over cumulative (upper bound, count) buckets; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def highest_filled(buckets: Iterable[tuple[float, float]]) -> float | None:
    """The lower bound of the highest bucket with observations in it: the smallest value the largest one had."""
    ordered = sorted(buckets)
    prev_bound, prev_count = 0.0, 0.0
    found = None
    for bound, count in ordered:
        if count > prev_count:
            found = prev_bound
        prev_bound, prev_count = bound, count
    return found


def _sum_by(rows: list[tuple[str, dict[str, str], float]], name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample, labels, value in rows:
        if sample == name and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


def _buckets(rows: list[tuple[str, dict[str, str], float]], name: str) -> list[tuple[float, float]]:
    by_le: dict[float, float] = {}
    for sample, labels, value in rows:
        if sample == name and "le" in labels:
            le = float(labels["le"])
            by_le[le] = by_le.get(le, 0.0) + value
    return sorted(by_le.items())


def _one(rows: list[tuple[str, dict[str, str], float]], name: str, pick: Any = max) -> float | None:
    values = [v for s, _, v in rows if s == name]
    return pick(values) if values else None


def from_pages(version: str, source: str, runtime: str | None, vllm: str | None) -> VersionMetrics:
    """A version's numbers from its decision server's /metrics page and its /metrics/vllm page (either may be
    missing); counts are totals since the process started."""
    rows = samples(runtime or "")
    m = VersionMetrics(version, source)
    m.decisions = _sum_by(rows, "arbiter_decisions_total", "outcome")
    m.fallbacks = _sum_by(rows, "arbiter_fallbacks_total", "reason")
    m.violations = _sum_by(rows, "arbiter_schema_violations_total", "kind")
    m.upstream_errors = _sum_by(rows, "arbiter_upstream_errors_total", "kind")
    m.upstream_up = _one(rows, "arbiter_upstream_up", min)
    m.audit_refused = _one(rows, "arbiter_audit_refused_total", sum)
    latency = _buckets(rows, "arbiter_decision_latency_seconds_bucket")
    m.latency_p50_s, m.latency_p99_s = quantile(0.5, latency), quantile(0.99, latency)
    m.objective_s = _one(rows, "arbiter_decision_latency_objective_seconds")
    if vllm is not None:
        v = samples(vllm)
        m.vllm_read = bool(v)
        m.waiting = _one(v, "vllm:num_requests_waiting", sum)
        m.running = _one(v, "vllm:num_requests_running", sum)
        m.kv_cache = _one(v, "vllm:kv_cache_usage_perc")
        m.preemptions = _one(v, "vllm:num_preemptions_total", sum)
        m.queue_p95_s = quantile(0.95, _buckets(v, "vllm:request_queue_time_seconds_bucket"))
        prompt = _buckets(v, "vllm:request_prompt_tokens_bucket")
        m.prompt_tokens_p99, m.prompt_tokens_max = quantile(0.99, prompt), highest_filled(prompt)
        m.finished = _sum_by(v, "vllm:request_success_total", "finished_reason")
    return m


def versions_on_page(text: str) -> list[str]:
    """The versions a decision server's /metrics page speaks for (its `version` label)."""
    return sorted({labels["version"] for name, labels, _ in samples(text)
                   if "version" in labels and name.startswith("arbiter_")})
