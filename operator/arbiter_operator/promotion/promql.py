"""The PromQL of an analysis: the numbers and label vectors to read for one version, and the user's checks with
their placeholders filled in (pure).

Every query selects one version: the candidate's numbers, and the stable version's decision mix and shadow
comparisons (the stable runtime records those while it mirrors traffic to the candidate). Series are matched on the
labels Prometheus attaches to the predictor pods' targets (see docs/operations.md, "Promotion metrics"):
- `namespace`: attached by Prometheus to every target in OpenShift user-workload monitoring;
- `arbiter_dev_decision_model` and `arbiter_dev_version`: the pod labels `arbiter.dev/decision-model` and
  `arbiter.dev/version`, copied onto the target by the PodMonitor's `podTargetLabels` (Prometheus replaces `.`,
  `/` and `-` by `_`).
Both vLLM's and the runtime's metrics come from the same pod, so one selector serves every query. The label names
are a parameter (`MetricLabels`) so a different monitoring setup can be matched without code changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbiter_operator.api.promotion import MetricCheck
from arbiter_operator.promotion.bounds import DecisionBounds

# Runtime metric names (runtime/arbiter_runtime/metrics.py) and vLLM's.
DECISIONS_TOTAL = "arbiter_decisions_total"
DECISION_LATENCY_BUCKET = "arbiter_decision_latency_seconds_bucket"
DECISION_LABELS_TOTAL = "arbiter_decision_labels_total"
FALLBACKS_TOTAL = "arbiter_fallbacks_total"
SCHEMA_VIOLATIONS_TOTAL = "arbiter_schema_violations_total"
SHADOW_REQUESTS_TOTAL = "arbiter_shadow_requests_total"
SHADOW_COMPARISONS_TOTAL = "arbiter_shadow_comparisons_total"
VLLM_E2E_LATENCY_BUCKET = "vllm:e2e_request_latency_seconds_bucket"
VLLM_QUEUE_TIME_BUCKET = "vllm:request_queue_time_seconds_bucket"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# The `outcome` values of arbiter_decisions_total.
ERROR_OUTCOME = "error"
FALLBACK_OUTCOME = "fallback"
LOW_CONFIDENCE_OUTCOME = "low_confidence"
LOW_CONFIDENCE_REASON = "low_confidence"


@dataclass(frozen=True)
class MetricLabels:
    """Prometheus label names that identify a version's pods."""

    namespace: str = "namespace"
    model: str = "arbiter_dev_decision_model"
    version: str = "arbiter_dev_version"


DEFAULT_LABELS = MetricLabels()


@dataclass(frozen=True)
class VectorQuery:
    """PromQL whose series are keyed by the values of `by` (joined with '->')."""

    promql: str
    by: tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(namespace: str, model: str, version: str, labels: MetricLabels = DEFAULT_LABELS) -> str:
    """The label matchers (without braces) of one version's pods."""
    return (
        f'{labels.namespace}="{_escape(namespace)}",{labels.model}="{_escape(model)}",'
        f'{labels.version}="{_escape(version)}"'
    )


def _counts(sel: str, w: str) -> dict[str, str]:
    """One version's counts in the window: decisions, and those of each kind the gates watch."""
    return {
        "requests": f"sum(increase({DECISIONS_TOTAL}{{{sel}}}{w}))",
        "errors": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{ERROR_OUTCOME}"}}{w}))',
        "fallbacks": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{FALLBACK_OUTCOME}"}}{w}))',
        "low_confidence": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{LOW_CONFIDENCE_OUTCOME}"}}{w}))',
        "schema_violations": f"sum(increase({SCHEMA_VIOLATIONS_TOTAL}{{{sel}}}{w}))",
    }


def build_queries(
    namespace: str, model: str, version: str, window_seconds: int, labels: MetricLabels = DEFAULT_LABELS,
    bounds: DecisionBounds | None = None, stable: str | None = None,
) -> dict[str, str]:
    """The single-number queries on the candidate's pods; with `stable` (the Sequential mode), the stable version's
    counts too, as `stable_<name>`."""
    sel = selector(namespace, model, version, labels)
    w = f"[{window_seconds}s]"
    out = _counts(sel, w)
    out["decision_p95"] = f"histogram_quantile(0.95, sum by (le) (rate({DECISION_LATENCY_BUCKET}{{{sel}}}{w})))"
    out["vllm_p95"] = f"histogram_quantile(0.95, sum by (le) (rate({VLLM_E2E_LATENCY_BUCKET}{{{sel}}}{w})))"
    if bounds is not None and bounds.max_queue_p95_ms is not None:
        out["queue_p95"] = f"histogram_quantile(0.95, sum by (le) (rate({VLLM_QUEUE_TIME_BUCKET}{{{sel}}}{w})))"
    if bounds is not None and bounds.max_kv_cache is not None:
        out["kv_cache"] = f"max(max_over_time({VLLM_KV_CACHE_USAGE}{{{sel}}}{w}))"
    if stable is not None:
        ssel = selector(namespace, model, stable, labels)
        out.update({f"stable_{name}": promql for name, promql in _counts(ssel, w).items()})
    return out


def sequential_vectors(namespace: str, model: str, version: str, stable: str, window_seconds: int,
                       labels: MetricLabels = DEFAULT_LABELS) -> dict[str, VectorQuery]:
    """Sequential mode: both versions' decision latency histograms (the count of decisions slower than the p95
    bound is read off them) and the stable version's fallback reasons."""
    w = f"[{window_seconds}s]"
    sel, ssel = selector(namespace, model, version, labels), selector(namespace, model, stable, labels)
    return {
        "latency_buckets": VectorQuery(f"sum by (le) (increase({DECISION_LATENCY_BUCKET}{{{sel}}}{w}))", ("le",)),
        "stable_latency_buckets": VectorQuery(
            f"sum by (le) (increase({DECISION_LATENCY_BUCKET}{{{ssel}}}{w}))", ("le",)
        ),
        "stable_fallback_reasons": VectorQuery(
            f"sum by (reason) (increase({FALLBACKS_TOTAL}{{{ssel}}}{w}))", ("reason",)
        ),
    }


def build_vectors(
    namespace: str, model: str, version: str, stable: str | None, window_seconds: int, shadow: bool,
    labels: MetricLabels = DEFAULT_LABELS,
) -> dict[str, VectorQuery]:
    sel = selector(namespace, model, version, labels)
    w = f"[{window_seconds}s]"
    out = {
        "fallback_reasons": VectorQuery(f"sum by (reason) (increase({FALLBACKS_TOTAL}{{{sel}}}{w}))", ("reason",)),
        "labels": VectorQuery(f"sum by (label) (increase({DECISION_LABELS_TOTAL}{{{sel}}}{w}))", ("label",)),
    }
    if stable is not None:
        ssel = selector(namespace, model, stable, labels)
        out["stable_labels"] = VectorQuery(
            f"sum by (label) (increase({DECISION_LABELS_TOTAL}{{{ssel}}}{w}))", ("label",)
        )
        if shadow:
            cand = f'candidate="{_escape(version)}"'
            out["shadow_agree"] = VectorQuery(
                f"sum by (agree) (increase({SHADOW_COMPARISONS_TOTAL}{{{ssel},{cand}}}{w}))", ("agree",)
            )
            out["shadow_requests"] = VectorQuery(
                f"sum by (result) (increase({SHADOW_REQUESTS_TOTAL}{{{ssel},{cand}}}{w}))", ("result",)
            )
            out["shadow_confusion"] = VectorQuery(
                f'sum by (stable_label, candidate_label) (increase({SHADOW_COMPARISONS_TOTAL}{{{ssel},{cand},'
                f'agree="false"}}{w}))',
                ("stable_label", "candidate_label"),
            )
    return out


def expand_check(check: MetricCheck, *, namespace: str, model: str, candidate: str, stable: str | None,
                 window_seconds: int, labels: MetricLabels = DEFAULT_LABELS) -> str:
    """A custom check's PromQL with its placeholders filled in (documented on MetricCheck.query)."""
    values = {
        "candidate": selector(namespace, model, candidate, labels),
        # Without a stable version the stable selector matches nothing rather than everything.
        "stable": selector(namespace, model, stable if stable is not None else "", labels),
        "window": f"{window_seconds}s",
        "namespace": namespace,
        "model": model,
        "candidateVersion": candidate,
        "stableVersion": stable or "",
    }
    out = check.query
    for key, value in values.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def check_queries(checks: Sequence[MetricCheck], *, namespace: str, model: str, candidate: str, stable: str | None,
                  window_seconds: int, labels: MetricLabels = DEFAULT_LABELS) -> dict[str, str]:
    """The user's checks' PromQL, named `check:<name>` among the analysis's queries."""
    return {
        f"check:{check.name}": expand_check(
            check, namespace=namespace, model=model, candidate=candidate, stable=stable,
            window_seconds=window_seconds, labels=labels,
        )
        for check in checks
    }
