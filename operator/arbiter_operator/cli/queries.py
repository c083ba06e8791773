"""The PromQL the plugin asks about one model's versions: the same series and labels the promotion analysis reads
(promotion/promql.py: `namespace`, `arbiter_dev_decision_model`, `arbiter_dev_version` on the predictor pods' targets),
and the operator's per-model state series (`decisionmodel_namespace`, `decisionmodel`)."""

from __future__ import annotations

from ..promotion.promql import selector
from .diagnose.evidence import VersionMetrics, highest_filled
from .promclient import Prometheus


def _window(seconds: float) -> str:
    return f"{max(1, int(seconds))}s"


def by(p: Prometheus, metric: str, label: str, sel: str, window: str) -> dict[str, float]:
    promql = f"sum by ({label}) (increase({metric}{{{sel}}}[{window}]))"
    return {labels.get(label, ""): v for labels, v in p.vector(promql)}


def version_metrics(p: Prometheus, namespace: str, model: str, version: str, window_s: float) -> VersionMetrics:
    """One version's numbers over the last `window_s` seconds (diagnose's evidence)."""
    sel = selector(namespace, model, version)
    w = _window(window_s)
    m = VersionMetrics(version, f"Prometheus {p.url}, last {w}")
    m.decisions = by(p, "arbiter_decisions_total", "outcome", sel, w)
    m.fallbacks = by(p, "arbiter_fallbacks_total", "reason", sel, w)
    m.violations = by(p, "arbiter_schema_violations_total", "kind", sel, w)
    m.upstream_errors = by(p, "arbiter_upstream_errors_total", "kind", sel, w)
    m.upstream_up = p.scalar(f"min(min_over_time(arbiter_upstream_up{{{sel}}}[{w}]))")
    m.audit_refused = p.scalar(f"sum(increase(arbiter_audit_refused_total{{{sel}}}[{w}]))")
    latency = f"sum by (le) (rate(arbiter_decision_latency_seconds_bucket{{{sel}}}[{w}]))"
    m.latency_p50_s = p.scalar(f"histogram_quantile(0.5, {latency})")
    m.latency_p99_s = p.scalar(f"histogram_quantile(0.99, {latency})")
    m.objective_s = p.scalar(f"max(arbiter_decision_latency_objective_seconds{{{sel}}})")
    m.waiting = p.scalar(f"max(max_over_time(vllm:num_requests_waiting{{{sel}}}[{w}]))")
    m.running = p.scalar(f"max(max_over_time(vllm:num_requests_running{{{sel}}}[{w}]))")
    m.kv_cache = p.scalar(f"max(max_over_time(vllm:kv_cache_usage_perc{{{sel}}}[{w}]))")
    m.preemptions = p.scalar(f"sum(increase(vllm:num_preemptions_total{{{sel}}}[{w}]))")
    m.queue_p95_s = p.scalar("histogram_quantile(0.95, sum by (le) "
                             f"(rate(vllm:request_queue_time_seconds_bucket{{{sel}}}[{w}])))")
    prompt = f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{{{sel}}}[{w}]))"
    m.prompt_tokens_p99 = p.scalar(f"histogram_quantile(0.99, {prompt})")
    m.prompt_tokens_max = highest_filled((float(labels["le"]), v) for labels, v in p.vector(prompt) if "le" in labels)
    m.finished = by(p, "vllm:request_success_total", "finished_reason", sel, w)
    m.busiest_cores = {labels.get("process", ""): v for labels, v in p.vector(
        f"max by (process) (rate(arbiter_vllm_process_cpu_seconds_total{{{sel}}}[{w}]))")}
    m.vllm_read = any(x is not None for x in (m.waiting, m.running, m.kv_cache))
    return m


def model_selector(namespace: str, model: str) -> str:
    """Every version of one model (selector() without the version)."""
    return selector(namespace, model, "").rsplit(",", 1)[0]
