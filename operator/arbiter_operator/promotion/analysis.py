"""Canary analysis: when a step must be analysed, the PromQL to run, and the verdict from the numbers.

`analysis_due` and `judge` are pure. `run_analysis` is the only I/O here: the observe layer calls it with a
Prometheus client (see arbiter_operator.clients.prometheus) and hands the result to `advance`.

Every query selects one version: the candidate's numbers, and the stable version's decision mix and shadow
comparisons (the stable runtime records those while it mirrors traffic to the candidate). Series are matched on the
labels Prometheus attaches to the predictor pods' targets (see docs/operations.md, "Promotion metrics"):
- `namespace`: attached by Prometheus to every target in OpenShift user-workload monitoring;
- `arbiter_dev_decision_model` and `arbiter_dev_version`: the pod labels `arbiter.dev/decision-model` and
  `arbiter.dev/version`, copied onto the target by the PodMonitor's `podTargetLabels` (Prometheus replaces `.`,
  `/` and `-` by `_`).
Both vLLM's and the runtime's metrics come from the same pod, so one selector serves every query. The label names
are a parameter (`MetricLabels`) so a different monitoring setup can be matched without code changes.


The gates (each one is a `CheckResult` in status, with its value and bound):
- p95LatencyMs, errorRate: the candidate's decision latency and share of failed decisions;
- fallbackRate (and fallbackRate/<reason> where a per-reason bound is set), lowConfidenceRate: shares of decisions;
- schemaViolationRate: rejected model answers (schema violations and inconsistent trajectories) per decision;
- decisionMixShift: the largest absolute difference, over labels, between the share of decisions the candidate and the
  stable version gave that label in the same window (judged only when both report a mix; see docs/operations.md);
- queueTimeP95Ms, kvCacheUsage: vLLM's p95 queue time and peak KV-cache use, only when a bound is set;
- agreement (shadow phase): the share of mirrored requests where both versions chose the same label;
- the user's custom checks (spec.promote.analysis.checks).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from arbiter_operator.api.promotion import (
    AnalysisRun,
    CheckResult,
    FallbackReasonBounds,
    MetricCheck,
    PromoteSpec,
    PromotionStatus,
    Shadow,
)
from arbiter_operator.api.times import format_time, parse_time

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

# Defaults of the decision bounds when neither spec.promote.analysis nor the version's metadata.sla sets one.
DEFAULT_MAX_FALLBACK_RATE = 0.05
DEFAULT_MAX_SCHEMA_VIOLATION_RATE = 0.01
DEFAULT_MAX_LOW_CONFIDENCE_RATE = 0.25
DEFAULT_MAX_DECISION_MIX_SHIFT = 0.10
DEFAULT_SHADOW = Shadow()


@dataclass(frozen=True)
class MetricLabels:
    """Prometheus label names that identify a version's pods."""

    namespace: str = "namespace"
    model: str = "arbiter_dev_decision_model"
    version: str = "arbiter_dev_version"


DEFAULT_LABELS = MetricLabels()


@dataclass(frozen=True)
class VersionBounds:
    """Decision-quality bounds a version promises (its metadata.sla); None: not stated."""

    max_fallback_rate: float | None = None
    max_schema_violation_rate: float | None = None
    max_low_confidence_rate: float | None = None


@dataclass(frozen=True)
class DecisionBounds:
    """The resolved decision gates of one analysis (spec > version metadata > default)."""

    max_fallback_rate: float = DEFAULT_MAX_FALLBACK_RATE
    max_fallback_by_reason: Mapping[str, float] = field(default_factory=dict)
    max_schema_violation_rate: float = DEFAULT_MAX_SCHEMA_VIOLATION_RATE
    max_low_confidence_rate: float = DEFAULT_MAX_LOW_CONFIDENCE_RATE
    max_mix_shift: float = DEFAULT_MAX_DECISION_MIX_SHIFT
    max_queue_p95_ms: float | None = None
    max_kv_cache: float | None = None
    min_agreement: float | None = None  # set in the shadow phase only
    min_compared: int = 0


@dataclass(frozen=True)
class VectorQuery:
    """PromQL whose series are keyed by the values of `by` (joined with '->')."""

    promql: str
    by: tuple[str, ...]


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


def whole_seconds(now: datetime) -> datetime:
    """Status times have whole seconds; comparing against truncated `now` keeps step boundaries exact."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).replace(microsecond=0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(namespace: str, model: str, version: str, labels: MetricLabels = DEFAULT_LABELS) -> str:
    """The label matchers (without braces) of one version's pods."""
    return (
        f'{labels.namespace}="{_escape(namespace)}",{labels.model}="{_escape(model)}",'
        f'{labels.version}="{_escape(version)}"'
    )


def build_queries(
    namespace: str, model: str, version: str, window_seconds: int, labels: MetricLabels = DEFAULT_LABELS,
    bounds: DecisionBounds | None = None,
) -> dict[str, str]:
    """The single-number queries on the candidate's pods."""
    sel = selector(namespace, model, version, labels)
    w = f"[{window_seconds}s]"
    out = {
        "requests": f"sum(increase({DECISIONS_TOTAL}{{{sel}}}{w}))",
        "errors": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{ERROR_OUTCOME}"}}{w}))',
        "decision_p95": f"histogram_quantile(0.95, sum by (le) (rate({DECISION_LATENCY_BUCKET}{{{sel}}}{w})))",
        "vllm_p95": f"histogram_quantile(0.95, sum by (le) (rate({VLLM_E2E_LATENCY_BUCKET}{{{sel}}}{w})))",
        "fallbacks": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{FALLBACK_OUTCOME}"}}{w}))',
        "low_confidence": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{LOW_CONFIDENCE_OUTCOME}"}}{w}))',
        "schema_violations": f"sum(increase({SCHEMA_VIOLATIONS_TOTAL}{{{sel}}}{w}))",
    }
    if bounds is not None and bounds.max_queue_p95_ms is not None:
        out["queue_p95"] = f"histogram_quantile(0.95, sum by (le) (rate({VLLM_QUEUE_TIME_BUCKET}{{{sel}}}{w})))"
    if bounds is not None and bounds.max_kv_cache is not None:
        out["kv_cache"] = f"max(max_over_time({VLLM_KV_CACHE_USAGE}{{{sel}}}{w}))"
    return out


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


def _hold_seconds(spec: PromoteSpec, status: PromotionStatus) -> int | None:
    if status.phase == "Shadowing":
        return (spec.shadow or DEFAULT_SHADOW).holdSeconds
    if status.phase == "Progressing" and 0 <= status.step < len(spec.steps):
        return spec.steps[status.step].holdSeconds
    return None


def _last_for_step(status: PromotionStatus) -> AnalysisRun | None:
    last = status.lastAnalysis
    started = parse_time(status.stepStartedAt)
    if last is None or started is None or last.step != status.step:
        return None
    at = parse_time(last.at)
    return last if at is not None and at >= started else None


def next_analysis_at(spec: PromoteSpec, status: PromotionStatus | None) -> tuple[datetime, bool] | None:
    """When the current canary step's (or shadow phase's) next analysis falls due, and whether it is the final one."""
    if status is None or status.candidate is None:
        return None
    if status.phase == "Progressing" and spec.strategy != "Canary":
        return None
    if status.phase == "Shadowing" and status.stable is None:
        return None
    hold = _hold_seconds(spec, status)
    started = parse_time(status.stepStartedAt)
    if hold is None or started is None:
        return None
    interval = timedelta(seconds=spec.analysis.intervalSeconds)
    hold_end = started + timedelta(seconds=hold)
    last = _last_for_step(status)
    last_at = parse_time(last.at) if last else None
    if last_at is not None and last_at >= hold_end:
        # The final analysis ran and did not pass (NoData with Wait, or Inconclusive): ask again an interval later.
        return last_at + interval, True
    interim = (last_at or started) + interval
    if interim < hold_end:
        return interim, False
    return hold_end, True


def resolve_bounds(spec: PromoteSpec, shadow: bool, version: VersionBounds | None = None) -> DecisionBounds:
    a, v = spec.analysis, version or VersionBounds()

    def pick(explicit: float | None, promised: float | None, default: float) -> float:
        return explicit if explicit is not None else (promised if promised is not None else default)

    sh = spec.shadow or DEFAULT_SHADOW
    return DecisionBounds(
        max_fallback_rate=pick(a.maxFallbackRate, v.max_fallback_rate, DEFAULT_MAX_FALLBACK_RATE),
        max_fallback_by_reason=(a.maxFallbackRateByReason or FallbackReasonBounds()).model_dump(exclude_none=True),
        max_schema_violation_rate=pick(
            a.maxSchemaViolationRate, v.max_schema_violation_rate, DEFAULT_MAX_SCHEMA_VIOLATION_RATE
        ),
        max_low_confidence_rate=pick(a.maxLowConfidenceRate, v.max_low_confidence_rate,
                                     DEFAULT_MAX_LOW_CONFIDENCE_RATE),
        max_mix_shift=a.maxDecisionMixShift if a.maxDecisionMixShift is not None else DEFAULT_MAX_DECISION_MIX_SHIFT,
        max_queue_p95_ms=a.maxQueueTimeP95Ms,
        max_kv_cache=a.maxKvCacheUsage,
        min_agreement=sh.minAgreement if shadow else None,
        min_compared=sh.minCompared if shadow else 0,
    )


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
    # A late interim analysis (the operator woke after the hold ended) is the final one: label it by the clock.
    step_started = parse_time(status.stepStartedAt)
    assert step_started is not None
    hold_end = step_started + timedelta(seconds=_hold_seconds(spec, status) or 0)
    final = now >= hold_end
    # The window never reaches back before the step started: samples from the previous step, or from a failed attempt
    # of the same version before a retry (same series, still in Prometheus), must not judge this step.
    # stepStartedAt has whole seconds (truncated), so the step began up to a second after it: one second less keeps
    # a retry started within the second its previous attempt failed from being judged on that attempt's last samples.
    elapsed = int((now - step_started).total_seconds()) - 1
    window = max(1, elapsed if shadow else min(spec.analysis.intervalSeconds, elapsed))
    bound = spec.analysis.p95LatencyMs if spec.analysis.p95LatencyMs is not None else sla_p95_ms
    bounds = resolve_bounds(spec, shadow, version_bounds)
    queries = build_queries(namespace, model, status.candidate, window, labels, bounds)
    for check in spec.analysis.checks:
        queries[f"check:{check.name}"] = expand_check(
            check, namespace=namespace, model=model, candidate=status.candidate, stable=status.stable,
            window_seconds=window, labels=labels,
        )
    return AnalysisQuery(
        version=status.candidate,
        step=status.step,
        at=now,
        window_seconds=window,
        queries=queries,
        p95_bound_ms=bound,
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

    def num(name: str) -> float | None:
        return as_number(values.get(name))

    b = query.bounds
    requests = num("requests")
    if requests is not None and requests < 0:
        requests = None
    decision_p95, vllm_p95 = num("decision_p95"), num("vllm_p95")
    # The runtime's decision latency is the gate: it is what the SLA promises (it includes the model call) and its
    # buckets resolve milliseconds. vLLM's e2e histogram starts at a 300 ms bucket, so its p95 of a 40 ms model reads
    # ~285 ms; it gates only when the runtime exports no latency at all, and is always reported.
    # In ms; a p95 in seconds too large to be one in ms (a broken exporter) is no number either.
    p95 = as_number(decision_p95 * 1000.0) if decision_p95 is not None else (
        as_number(vllm_p95 * 1000.0) if vllm_p95 is not None else None)

    def share(name: str) -> float | None:
        # A missing series only means nothing of the kind happened yet, as long as decisions were counted.
        if requests is None or requests <= 0:
            return None
        return max(0.0, num(name) or 0.0) / requests

    error_rate = share("errors")
    common.update(requests=requests, p95LatencyMs=p95, errorRate=error_rate)
    window = f"{query.window_seconds}s"

    shadow_note = ""
    agree = _counts(values.get("shadow_agree"))
    compared = agree.get("true", 0.0) + agree.get("false", 0.0)
    if query.shadow:
        sent = _counts(values.get("shadow_requests"))
        shadow_note = (
            f"; shadow: {compared:.0f} compared (minCompared {b.min_compared}), "
            + ", ".join(f"{k} {sent.get(k, 0.0):.0f}" for k in ("sent", "dropped", "error"))
        )
    if requests is None or requests < query.min_requests:
        seen = "no decision metrics" if requests is None else f"{requests:.0f} requests"
        return AnalysisRun(
            verdict="NoData",
            message=f"{query.version}: {seen} in the last {window}, fewer than minRequests={query.min_requests}"
            + shadow_note,
            **common,
        )
    if query.shadow and compared < b.min_compared:
        return AnalysisRun(
            verdict="NoData",
            message=f"{query.version}: waiting for shadow data: {compared:.0f} compared requests in the last {window}, "
            f"fewer than minCompared={b.min_compared}" + shadow_note,
            **common,
        )
    if query.p95_bound_ms is not None and p95 is None:
        return AnalysisRun(
            verdict="NoData", message=f"{query.version}: no latency samples in the last {window}", **common
        )

    ms = lambda v: _fmt(v, "ms")  # noqa: E731
    checks = [
        _check("p95LatencyMs", p95, query.p95_bound_ms, what="p95 latency", fmt=ms),
        _check("errorRate", error_rate, query.max_error_rate, what="error rate"),
        _check("fallbackRate", share("fallbacks"), b.max_fallback_rate, what="fallback rate"),
    ]
    reasons = _counts(values.get("fallback_reasons"))
    for reason, bound in sorted(b.max_fallback_by_reason.items()):
        checks.append(_check(f"fallbackRate/{reason}", reasons.get(reason, 0.0) / requests if requests else None,
                             bound, what=f"fallback rate ({reason})"))
    low = (max(0.0, num("low_confidence") or 0.0) + reasons.get(LOW_CONFIDENCE_REASON, 0.0)) / requests
    checks.append(_check("lowConfidenceRate", low if requests > 0 else None, b.max_low_confidence_rate,
                         what="low-confidence rate"))
    checks.append(_check("schemaViolationRate", share("schema_violations"), b.max_schema_violation_rate,
                         what="schema violation rate"))
    mix = None
    if query.stable is not None:
        cand_mix, stable_mix = _counts(values.get("labels")), _counts(values.get("stable_labels"))
        mix = mix_shift(cand_mix, stable_mix) if sum(stable_mix.values()) >= max(1, query.min_requests) else None
        if mix is None:
            # Not the candidate's fault (the stable saw too little, or a runtime without the metric): not judged.
            checks.append(CheckResult(name="decisionMixShift", bound=b.max_mix_shift, verdict="NoData",
                                      message="decision mix shift: not judged (no decision mix from both versions)"))
        else:
            shift, label, noise = mix
            c = _check("decisionMixShift", shift, b.max_mix_shift, what="decision mix shift")
            detail = f"label {label!r}"
            if c.verdict == "Fail" and shift <= noise:
                # Above the bound, but within chance for this many decisions: not a failure (yet).
                c = c.model_copy(update={"verdict": "Pass", "message": f"decision mix shift {_pct(shift)} above max "
                                         f"{_pct(b.max_mix_shift)} but within noise"})
                detail += f", {MIX_SIGNIFICANCE:g} standard errors {_pct(noise)}"
            checks.append(c.model_copy(update={"message": f"{c.message} ({detail})"}))
    if b.max_queue_p95_ms is not None:
        q = num("queue_p95")
        checks.append(_check("queueTimeP95Ms", None if q is None else q * 1000.0, b.max_queue_p95_ms,
                             what="vLLM queue time p95", fmt=ms))
    if b.max_kv_cache is not None:
        checks.append(_check("kvCacheUsage", num("kv_cache"), b.max_kv_cache, what="vLLM KV-cache use"))
    if query.shadow and b.min_agreement is not None:
        c = _check("agreement", agree.get("true", 0.0) / compared, b.min_agreement, "min", what="shadow agreement")
        confusion = sorted(_counts(values.get("shadow_confusion")).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        if confusion:
            c = c.model_copy(update={"message": c.message + " (top disagreements stable->candidate: "
                                     + ", ".join(f"{k} {v:.0f}" for k, v in confusion) + ")"})
        checks.append(c)
    for check in query.checks:
        checks.append(_check(check.name, num(f"check:{check.name}"), check.bound, check.direction,
                             fmt=lambda v: f"{v:.4g}"))
    common["checks"] = checks

    numbers = (
        f"p95 {_fmt(p95, 'ms')} (bound {_fmt(query.p95_bound_ms, 'ms')}), "
        f"error rate {_fmt(None if error_rate is None else error_rate * 100, '%', 2)} "
        f"(max {query.max_error_rate * 100:.2f}%), {requests:.0f} requests in {window}"
    )
    if vllm_p95 is not None and decision_p95 is not None:
        numbers += f"; vLLM e2e p95 {vllm_p95 * 1000.0:.1f}ms"
    if query.shadow:
        numbers += f"; {compared:.0f} shadow comparisons"

    breaches = []
    legacy = {"errorRate": "error rate above maxErrorRate", "p95LatencyMs": "p95 latency above bound"}
    for c in checks:
        if c.verdict == "Fail":
            breaches.append(legacy.get(c.name) or c.message)
    if breaches:
        return AnalysisRun(verdict="Fail", message=f"{query.version}: {'; '.join(breaches)}: {numbers}", **common)
    missing = [c for c in checks if c.verdict == "NoData" and c.name != "decisionMixShift"]
    if missing:
        return AnalysisRun(
            verdict="Inconclusive",
            message=f"{query.version}: no data for {', '.join(c.name for c in missing)}: {numbers}",
            **common,
        )
    extra = [c.message for c in checks if c.name not in legacy]
    return AnalysisRun(verdict="Pass", message=f"{query.version}: {numbers}; " + "; ".join(extra), **common)
