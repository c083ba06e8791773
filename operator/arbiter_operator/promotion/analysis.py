"""Canary analysis: when a step must be analysed, and the verdict from the numbers (pure).

`analysis_due` says which analysis a reconcile must run (its PromQL from promotion.promql, its bounds from
promotion.bounds); the observe layer runs it against Prometheus (observe/analysis.py `run_analysis`) and `judge`s
the numbers, and `advance` acts on the verdict. The gates are promotion.gates' rows (the Windowed mode judges them
on the last intervalSeconds); the Sequential mode judges the counted ones on everything since the step began with
always-valid tests (promotion.evidence, promotion.sequential) and the others as the Windowed mode does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from arbiter_operator.api.promotion import AnalysisRun, CheckResult, MetricCheck, PromoteSpec, PromotionStatus
from arbiter_operator.api.times import format_time
from arbiter_operator.promotion.bounds import (
    DecisionBounds,
    SequentialBounds,
    p95_bound_ms,
    resolve_bounds,
    sequential_bounds,
)

# The observe layer states a version's SLA with VersionBounds when it asks for `analysis_due`.
from arbiter_operator.promotion.bounds import VersionBounds as VersionBounds
from arbiter_operator.promotion.evidence import judge_sequential
from arbiter_operator.promotion.gates import Numbers, compared, gates, share

# Re-exported: what the analysis's callers and tests read from here.
from arbiter_operator.promotion.gates import mix_shift as mix_shift
from arbiter_operator.promotion.promql import (
    DEFAULT_LABELS,
    MetricLabels,
    VectorQuery,
    build_queries,
    build_vectors,
    check_queries,
    sequential_vectors,
)
from arbiter_operator.promotion.schedule import analysis_window, next_analysis_at, whole_seconds
from arbiter_operator.promotion.values import as_number as as_number
from arbiter_operator.promotion.values import counts, fmt


@dataclass(frozen=True)
class AnalysisQuery:
    """One analysis to run: PromQL evaluated at `at`, and the bounds that judge the numbers."""

    version: str
    step: int
    at: datetime  # evaluation time (whole seconds, UTC); also the AnalysisRun's `at`
    window_seconds: int
    queries: Mapping[str, str]  # one number each: requests, errors, decision_p95, vllm_p95, fallbacks, ...
    p95_bound_ms: float | None
    max_error_rate: float
    min_requests: int
    final: bool  # True at (or after) the end of the step's hold: a Pass advances; before, only a Fail acts
    vectors: Mapping[str, VectorQuery] = field(default_factory=dict)  # label mixes, fallback reasons, shadow
    bounds: DecisionBounds = field(default_factory=DecisionBounds)
    checks: tuple[MetricCheck, ...] = ()  # custom checks; their PromQL is queries["check:<name>"]
    stable: str | None = None
    shadow: bool = False
    sequential: SequentialBounds | None = None  # the Sequential mode's settings; None: the Windowed mode


def analysis_due(
    spec: PromoteSpec,
    status: PromotionStatus | None,
    now: datetime,
    *,
    namespace: str,
    model: str,
    sla_p95_ms: float | None = None,
    labels: MetricLabels = DEFAULT_LABELS,
    version_bounds: VersionBounds | None = None,
) -> AnalysisQuery | None:
    """The analysis the observe layer must run before calling `advance`, or None when none is due.

    During a step's hold an analysis runs every `intervalSeconds` so a breach rolls back early; the analysis at the
    end of the hold decides whether the step passes. In the shadow phase the window covers the whole phase so far:
    mirrored requests are a sample, and agreement is judged on all of them. The Sequential mode looks every
    `lookSeconds` at everything since the step began, the stable version's counts beside the candidate's.
    """
    due = next_analysis_at(spec, status)
    if due is None:
        return None
    at, _ = due
    now = whole_seconds(now)
    if now < at:
        return None
    assert status is not None and status.candidate is not None and status.stepStartedAt is not None
    shadow = status.phase == "Shadowing"
    window, final = analysis_window(spec, status, now, shadow)
    bounds = resolve_bounds(spec, shadow, version_bounds)
    seq = sequential_bounds(spec) if status.stable is not None else None
    queries = build_queries(namespace, model, status.candidate, window, labels, bounds,
                            stable=status.stable if seq else None)
    vectors = build_vectors(namespace, model, status.candidate, status.stable, window, shadow, labels)
    if seq is not None and status.stable is not None:
        vectors.update(sequential_vectors(namespace, model, status.candidate, status.stable, window, labels))
    queries.update(check_queries(spec.analysis.checks, namespace=namespace, model=model, candidate=status.candidate,
                                 stable=status.stable, window_seconds=window, labels=labels))
    return AnalysisQuery(
        version=status.candidate,
        step=status.step,
        at=now,
        window_seconds=window,
        queries=queries,
        p95_bound_ms=p95_bound_ms(spec, sla_p95_ms),
        max_error_rate=spec.analysis.maxErrorRate,
        min_requests=spec.analysis.minRequests,
        final=final,
        vectors=vectors,
        bounds=bounds,
        checks=tuple(spec.analysis.checks),
        stable=status.stable,
        shadow=shadow,
        sequential=seq,
    )


def _p95_ms(decision_p95: float | None, vllm_p95: float | None) -> float | None:
    # The runtime's decision latency is the gate: it is what the SLA promises (it includes the model call) and its
    # buckets resolve milliseconds. vLLM's e2e histogram starts at a 300 ms bucket, so its p95 of a 40 ms model reads
    # ~285 ms; it gates only when the runtime exports no latency at all, and is always reported.
    # In ms; a p95 in seconds too large to be one in ms (a broken exporter) is no number either.
    return as_number(decision_p95 * 1000.0) if decision_p95 is not None else (
        as_number(vllm_p95 * 1000.0) if vllm_p95 is not None else None)


def _too_little(query: AnalysisQuery, values: Mapping[str, Any], requests: float | None,
                p95: float | None) -> str | None:
    """Why the numbers do not count yet (a NoData run's message), or None when they do."""
    b, window, seen = query.bounds, f"{query.window_seconds}s", compared(values)
    shadow_note = ""
    if query.shadow:
        sent = counts(values.get("shadow_requests"))
        shadow_note = (
            f"; shadow: {seen:.0f} compared (minCompared {b.min_compared}), "
            + ", ".join(f"{k} {sent.get(k, 0.0):.0f}" for k in ("sent", "dropped", "error"))
        )
    if requests is None or requests < query.min_requests:
        got = "no decision metrics" if requests is None else f"{requests:.0f} requests"
        return (f"{query.version}: {got} in the last {window}, fewer than minRequests={query.min_requests}"
                + shadow_note)
    if query.shadow and seen < b.min_compared:
        return (f"{query.version}: waiting for shadow data: {seen:.0f} compared requests in the last {window}, "
                f"fewer than minCompared={b.min_compared}" + shadow_note)
    if query.p95_bound_ms is not None and p95 is None:
        return f"{query.version}: no latency samples in the last {window}"
    return None


# A latency or error-rate breach is named in these words rather than by its gate's message: failure messages start
# with them, and docs/argocd.md quotes them.
_LEGACY = {"errorRate": "error rate above maxErrorRate", "p95LatencyMs": "p95 latency above bound"}


def _verdict(query: AnalysisQuery, checks: list[CheckResult], numbers: str, common: dict[str, Any]) -> AnalysisRun:
    """Fail on any failed gate; Inconclusive while a gate has no data; NoData while a gate waits for evidence (too
    few decisions on either version, or a difference within noise: the step holds); else Pass."""
    breaches = [_LEGACY.get(c.name) or c.message for c in checks if c.verdict == "Fail"]
    if breaches:
        return AnalysisRun(verdict="Fail", message=f"{query.version}: {'; '.join(breaches)}: {numbers}", **common)
    missing = [c for c in checks if c.verdict == "NoData"]
    if missing:
        return AnalysisRun(
            verdict="Inconclusive",
            message=f"{query.version}: no data for {', '.join(c.name for c in missing)}: {numbers}",
            **common,
        )
    pending = [c for c in checks if c.verdict == "Pending"]
    if pending:
        return AnalysisRun(verdict="NoData", message=f"{query.version}: not enough evidence: "
                           f"{'; '.join(c.message for c in pending)}: {numbers}", **common)
    extra = [c.message for c in checks if c.name not in _LEGACY]
    return AnalysisRun(verdict="Pass", message=f"{query.version}: {numbers}; " + "; ".join(extra), **common)


def judge(query: AnalysisQuery, values: Mapping[str, Any], error: str | None = None) -> AnalysisRun:
    """Verdict from measured numbers. `values` maps query names to a number (None for an empty result) and vector
    names to {key: number}. Anything else (NaN, Inf, strings, missing names) counts as "no data" and never a pass;
    the numbers count only with `min_requests` requests (and, in the shadow phase, `min_compared` comparisons)."""
    common: dict[str, Any] = dict(
        at=format_time(query.at),
        step=query.step,
        p95BoundMs=query.p95_bound_ms,
        maxErrorRate=query.max_error_rate,
        minRequests=query.min_requests,
        windowSeconds=query.window_seconds,
        mode="Sequential" if query.sequential is not None else "Windowed",
    )
    if error is not None:
        return AnalysisRun(verdict="Inconclusive", message=f"metrics query failed: {error}"[:1000], **common)
    if not isinstance(values, Mapping):
        values = {}
    requests = as_number(values.get("requests"))
    if requests is not None and requests < 0:
        requests = None
    decision_p95, vllm_p95 = as_number(values.get("decision_p95")), as_number(values.get("vllm_p95"))
    p95 = _p95_ms(decision_p95, vllm_p95)
    error_rate = share(values, requests, "errors")
    common.update(requests=requests, p95LatencyMs=p95, errorRate=error_rate)
    if query.sequential is not None and requests is not None:
        # Every count since the step began is evidence, a few decisions too: no minRequests before a Fail.
        others = [g.check(Numbers(query, values, requests, p95)) for g in gates(query) if not g.counted]
        return judge_sequential(query, values, others, p95, common)
    waiting = _too_little(query, values, requests, p95)
    if waiting is not None:
        return AnalysisRun(verdict="NoData", message=waiting, **common)
    assert requests is not None  # without a request count the numbers never count
    n = Numbers(query, values, requests, p95)
    checks = [g.check(n) for g in gates(query)]
    common["checks"] = checks

    numbers = (
        f"p95 {fmt(p95, 'ms')} (bound {fmt(query.p95_bound_ms, 'ms')}), "
        f"error rate {fmt(None if error_rate is None else error_rate * 100, '%', 2)} "
        f"(max {query.max_error_rate * 100:.2f}%), {requests:.0f} requests in {query.window_seconds}s"
    )
    if vllm_p95 is not None and decision_p95 is not None:
        numbers += f"; vLLM e2e p95 {vllm_p95 * 1000.0:.1f}ms"
    if query.shadow:
        numbers += f"; {n.compared():.0f} shadow comparisons"
    return _verdict(query, checks, numbers, common)
