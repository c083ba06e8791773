"""Canary analysis: when a step must be analysed, and the verdict from the numbers (pure).

`analysis_due` says which analysis a reconcile must run (its PromQL from promotion.promql, its bounds from
promotion.bounds); the observe layer runs it against Prometheus (observe/analysis.py `run_analysis`) and `judge`s
the numbers, and `advance` acts on the verdict.

The gates (each one is a `CheckResult` in status, with its value and bound), one row each of `GATES`:
- p95LatencyMs, errorRate: the candidate's decision latency and share of failed decisions;
- fallbackRate (and fallbackRate/<reason> where a per-reason bound is set), lowConfidenceRate: shares of decisions;
- schemaViolationRate: rejected model answers (schema violations and inconsistent trajectories) per decision;
- decisionMixShift: the largest absolute difference, over labels, between the share of decisions the candidate and the
  stable version gave that label in the same window (judged only when both report a mix; see docs/operations.md);
- queueTimeP95Ms, kvCacheUsage: vLLM's p95 queue time and peak KV-cache use, only when a bound is set;
- agreement (shadow phase): the share of mirrored requests where both versions chose the same label;
- the user's custom checks (spec.promote.analysis.checks), judged by the same loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from arbiter_operator.api.promotion import AnalysisRun, CheckResult, MetricCheck, PromoteSpec, PromotionStatus
from arbiter_operator.api.times import format_time
from arbiter_operator.promotion.bounds import DecisionBounds, p95_bound_ms, resolve_bounds

# The observe layer states a version's SLA with VersionBounds when it asks for `analysis_due`.
from arbiter_operator.promotion.bounds import VersionBounds as VersionBounds
from arbiter_operator.promotion.promql import (
    DEFAULT_LABELS,
    LOW_CONFIDENCE_REASON,
    MetricLabels,
    VectorQuery,
    build_queries,
    build_vectors,
    check_queries,
)
from arbiter_operator.promotion.schedule import analysis_window, next_analysis_at, whole_seconds


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
    mirrored requests are a sample, and agreement is judged on all of them.
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
    queries = build_queries(namespace, model, status.candidate, window, labels, bounds)
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
        vectors=build_vectors(namespace, model, status.candidate, status.stable, window, shadow, labels),
        bounds=bounds,
        checks=tuple(spec.analysis.checks),
        stable=status.stable,
        shadow=shadow,
    )


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def _ms(value: float | None) -> str:
    return _fmt(value, "ms")


def as_number(value: Any) -> float | None:
    """A finite float, or None for anything else Prometheus (or a broken proxy) may hand back."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def _counts(value: Any) -> dict[str, float]:
    """A {key: count} mapping with only finite, non-negative counts (counter increases can't be negative)."""
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, raw in value.items():
        n = as_number(raw)
        if isinstance(key, str) and n is not None and n >= 0:
            out[key] = n
    return out


# A mix shift fails only when it is also this many standard errors of the share difference: with a few hundred
# decisions per window, label shares of two identical versions differ by several points by chance alone.
MIX_SIGNIFICANCE = 3.0


def mix_shift(candidate: Mapping[str, float], stable: Mapping[str, float]) -> tuple[float, str, float] | None:
    """(largest absolute label-share difference, the label it is on, that difference's noise: MIX_SIGNIFICANCE
    standard errors); None when either side has no decisions."""
    ct, stt = sum(candidate.values()), sum(stable.values())
    if ct <= 0 or stt <= 0:
        return None
    best, where, noise = -1.0, "", 0.0
    for label in sorted(set(candidate) | set(stable)):
        c, s = candidate.get(label, 0.0), stable.get(label, 0.0)
        d = abs(c / ct - s / stt)
        if d > best:
            pooled = (c + s) / (ct + stt)
            se = math.sqrt(max(0.0, pooled * (1 - pooled)) * (1 / ct + 1 / stt))
            best, where, noise = d, label, MIX_SIGNIFICANCE * se
    return best, where, noise


def _check(name: str, value: float | None, bound: float | None, direction: str = "max", what: str = "",
           fmt: Any = _pct) -> CheckResult:
    if value is None or bound is None:
        verdict = "NoData" if bound is not None else "Pass"
        return CheckResult(name=name, value=value, bound=bound, direction=direction, verdict=verdict,
                           message=f"{what or name}: no data" if value is None else f"{what or name} {fmt(value)}")
    bad = value > bound if direction == "max" else value < bound
    if bad:
        word = "above max" if direction == "max" else "below min"
    else:
        word = "within max" if direction == "max" else "at or above min"
    return CheckResult(name=name, value=value, bound=bound, direction=direction,
                       verdict="Fail" if bad else "Pass", message=f"{what or name} {fmt(value)} {word} {fmt(bound)}")


def _compared(values: Mapping[str, Any]) -> float:
    """Mirrored requests both versions answered (the shadow phase's sample)."""
    agree = _counts(values.get("shadow_agree"))
    return agree.get("true", 0.0) + agree.get("false", 0.0)


def _share(values: Mapping[str, Any], requests: float | None, name: str) -> float | None:
    # A missing series only means nothing of the kind happened yet, as long as decisions were counted.
    if requests is None or requests <= 0:
        return None
    return max(0.0, as_number(values.get(name)) or 0.0) / requests


@dataclass(frozen=True)
class Numbers:
    """What the gates read: one analysis's answers (any shape; read only through `num` and `counts`, which turn
    anything but a finite number into no data) and the request count, known to be at least minRequests."""

    query: AnalysisQuery
    values: Mapping[str, Any]
    requests: float
    p95_ms: float | None  # the gating p95 (see `_p95_ms`)

    def num(self, name: str) -> float | None:
        return as_number(self.values.get(name))

    def counts(self, name: str) -> dict[str, float]:
        return _counts(self.values.get(name))

    def share(self, name: str) -> float | None:
        return _share(self.values, self.requests, name)

    def compared(self) -> float:
        return _compared(self.values)

    def mix(self) -> tuple[float, str, float] | None:
        """The decision mix shift (see `mix_shift`), when the stable version saw enough decisions to compare with."""
        stable = self.counts("stable_labels")
        if sum(stable.values()) < max(1, self.query.min_requests):
            return None
        return mix_shift(self.counts("labels"), stable)


def _always(query: AnalysisQuery) -> bool:
    return True


@dataclass(frozen=True)
class Gate:
    """One gate, judged into one CheckResult by `_check`: a built-in row of GATES or one of the user's checks.

    Its bound was resolved when the query was built (`analysis_due`, by promotion.bounds: spec.promote.analysis,
    else the version's metadata.sla, else the default), because the observe layer runs the PromQL in between and
    `judge` never sees the spec: `bound` reads the resolved one off the query."""

    name: str
    what: str  # how messages name it
    value: Callable[[Numbers], float | None]  # the observed value, None for no data
    bound: Callable[[AnalysisQuery], float | None]
    direction: Literal["max", "min"] = "max"
    applies: Callable[[AnalysisQuery], bool] = _always
    optional: bool = False  # off (not listed at all) unless its bound is set
    fmt: Callable[[float], str] = _pct  # how its value and bound are written in messages
    reading: Callable[[CheckResult, Numbers], CheckResult] | None = None  # what this gate adds to the plain verdict

    def check(self, numbers: Numbers) -> CheckResult:
        c = _check(self.name, self.value(numbers), self.bound(numbers.query), self.direction, self.what, self.fmt)
        return c if self.reading is None else self.reading(c, numbers)


def _low_confidence_rate(n: Numbers) -> float | None:
    # Flagged decisions and those handed to the rules for low confidence: the model was unsure of both.
    flagged = max(0.0, n.num("low_confidence") or 0.0)
    if n.requests <= 0:
        return None  # no decisions (minRequests may be 0): no data, never a division by zero
    return (flagged + n.counts("fallback_reasons").get(LOW_CONFIDENCE_REASON, 0.0)) / n.requests


def _fallback_reason_gates(query: AnalysisQuery) -> list[Gate]:
    """fallbackRate/<reason>, for every reason with a bound of its own (spec.promote.analysis only)."""
    def gate(reason: str, bound: float) -> Gate:
        return Gate(
            f"fallbackRate/{reason}", f"fallback rate ({reason})",
            lambda n: n.counts("fallback_reasons").get(reason, 0.0) / n.requests if n.requests else None,
            lambda q: bound,
        )

    return [gate(reason, bound) for reason, bound in sorted(query.bounds.max_fallback_by_reason.items())]


def _custom_gates(query: AnalysisQuery) -> list[Gate]:
    """spec.promote.analysis.checks: the number of each one's PromQL against its own bound and direction."""
    def gate(check: MetricCheck) -> Gate:
        return Gate(check.name, check.name, lambda n: n.num(f"check:{check.name}"), lambda q: check.bound,
                    check.direction, fmt=lambda v: f"{v:.4g}")

    return [gate(check) for check in query.checks]


def _mix_reading(c: CheckResult, n: Numbers) -> CheckResult:
    """The label the shift is on, and a shift above the bound that chance alone explains for this many decisions
    is no failure (yet)."""
    mix = n.mix()
    if mix is None:
        # Not the candidate's fault (the stable saw too little, or a runtime without the metric): not judged.
        return CheckResult(name=c.name, bound=c.bound, verdict="NoData",
                           message="decision mix shift: not judged (no decision mix from both versions)")
    shift, label, noise = mix
    detail = f"label {label!r}"
    if c.verdict == "Fail" and shift <= noise:
        c = c.model_copy(update={"verdict": "Pass", "message": f"decision mix shift {_pct(shift)} above max "
                                 f"{_pct(c.bound)} but within noise"})
        detail += f", {MIX_SIGNIFICANCE:g} standard errors {_pct(noise)}"
    return c.model_copy(update={"message": f"{c.message} ({detail})"})


def _shift(n: Numbers) -> float | None:
    mix = n.mix()
    return None if mix is None else mix[0]


def _agreement_reading(c: CheckResult, n: Numbers) -> CheckResult:
    """The most frequent disagreements, so a failed shadow phase says what the candidate decides differently."""
    confusion = sorted(n.counts("shadow_confusion").items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    if not confusion:
        return c
    return c.model_copy(update={"message": c.message + " (top disagreements stable->candidate: "
                                + ", ".join(f"{k} {v:.0f}" for k, v in confusion) + ")"})


def _queue_p95_ms(n: Numbers) -> float | None:
    q = n.num("queue_p95")
    return None if q is None else q * 1000.0


# The gates in the order status lists them; a function row stands for the gates it makes from the query.
GATES: tuple[Gate | Callable[[AnalysisQuery], list[Gate]], ...] = (
    Gate("p95LatencyMs", "p95 latency", lambda n: n.p95_ms, lambda q: q.p95_bound_ms, fmt=_ms),
    Gate("errorRate", "error rate", lambda n: n.share("errors"), lambda q: q.max_error_rate),
    Gate("fallbackRate", "fallback rate", lambda n: n.share("fallbacks"), lambda q: q.bounds.max_fallback_rate),
    _fallback_reason_gates,
    Gate("lowConfidenceRate", "low-confidence rate", _low_confidence_rate, lambda q: q.bounds.max_low_confidence_rate),
    Gate("schemaViolationRate", "schema violation rate", lambda n: n.share("schema_violations"),
         lambda q: q.bounds.max_schema_violation_rate),
    Gate("decisionMixShift", "decision mix shift", _shift, lambda q: q.bounds.max_mix_shift,
         applies=lambda q: q.stable is not None, reading=_mix_reading),
    Gate("queueTimeP95Ms", "vLLM queue time p95", _queue_p95_ms, lambda q: q.bounds.max_queue_p95_ms, optional=True,
         fmt=_ms),
    Gate("kvCacheUsage", "vLLM KV-cache use", lambda n: n.num("kv_cache"), lambda q: q.bounds.max_kv_cache,
         optional=True),
    Gate("agreement", "shadow agreement", lambda n: n.counts("shadow_agree").get("true", 0.0) / n.compared(),
         lambda q: q.bounds.min_agreement, "min", applies=lambda q: q.shadow, optional=True,
         reading=_agreement_reading),
    _custom_gates,
)


def _gates(query: AnalysisQuery) -> list[Gate]:
    """The gates this analysis judges, in status order."""
    rows = [g for row in GATES for g in ([row] if isinstance(row, Gate) else row(query))]
    return [g for g in rows if g.applies(query) and not (g.optional and g.bound(query) is None)]


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
    b, window, compared = query.bounds, f"{query.window_seconds}s", _compared(values)
    shadow_note = ""
    if query.shadow:
        sent = _counts(values.get("shadow_requests"))
        shadow_note = (
            f"; shadow: {compared:.0f} compared (minCompared {b.min_compared}), "
            + ", ".join(f"{k} {sent.get(k, 0.0):.0f}" for k in ("sent", "dropped", "error"))
        )
    if requests is None or requests < query.min_requests:
        seen = "no decision metrics" if requests is None else f"{requests:.0f} requests"
        return (f"{query.version}: {seen} in the last {window}, fewer than minRequests={query.min_requests}"
                + shadow_note)
    if query.shadow and compared < b.min_compared:
        return (f"{query.version}: waiting for shadow data: {compared:.0f} compared requests in the last {window}, "
                f"fewer than minCompared={b.min_compared}" + shadow_note)
    if query.p95_bound_ms is not None and p95 is None:
        return f"{query.version}: no latency samples in the last {window}"
    return None


# A latency or error-rate breach is named in these words rather than by its gate's message: failure messages start
# with them, and docs/argocd.md quotes them.
_LEGACY = {"errorRate": "error rate above maxErrorRate", "p95LatencyMs": "p95 latency above bound"}


def _verdict(query: AnalysisQuery, checks: list[CheckResult], numbers: str, common: dict[str, Any]) -> AnalysisRun:
    """Fail on any failed gate; Inconclusive while a gate has no data (but an unjudged decision mix); else Pass."""
    breaches = [_LEGACY.get(c.name) or c.message for c in checks if c.verdict == "Fail"]
    if breaches:
        return AnalysisRun(verdict="Fail", message=f"{query.version}: {'; '.join(breaches)}: {numbers}", **common)
    missing = [c for c in checks if c.verdict == "NoData" and c.name != "decisionMixShift"]
    if missing:
        return AnalysisRun(
            verdict="Inconclusive",
            message=f"{query.version}: no data for {', '.join(c.name for c in missing)}: {numbers}",
            **common,
        )
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
    error_rate = _share(values, requests, "errors")
    common.update(requests=requests, p95LatencyMs=p95, errorRate=error_rate)
    waiting = _too_little(query, values, requests, p95)
    if waiting is not None:
        return AnalysisRun(verdict="NoData", message=waiting, **common)
    assert requests is not None  # without a request count the numbers never count
    n = Numbers(query, values, requests, p95)
    checks = [g.check(n) for g in _gates(query)]
    common["checks"] = checks

    numbers = (
        f"p95 {_fmt(p95, 'ms')} (bound {_fmt(query.p95_bound_ms, 'ms')}), "
        f"error rate {_fmt(None if error_rate is None else error_rate * 100, '%', 2)} "
        f"(max {query.max_error_rate * 100:.2f}%), {requests:.0f} requests in {query.window_seconds}s"
    )
    if vllm_p95 is not None and decision_p95 is not None:
        numbers += f"; vLLM e2e p95 {vllm_p95 * 1000.0:.1f}ms"
    if query.shadow:
        numbers += f"; {n.compared():.0f} shadow comparisons"
    return _verdict(query, checks, numbers, common)
