"""Canary analysis: when a step must be analysed, the PromQL to run, and the verdict from the numbers.

`analysis_due` and `judge` are pure. `run_analysis` is the only I/O here: the observe layer calls it with a
Prometheus client (see arbiter_operator.clients.prometheus) and hands the result to `advance`.

Every query selects the candidate version only. Series are matched on the labels Prometheus attaches to the
predictor pods' targets (see docs/operations.md, "Promotion metrics"):
- `namespace`: attached by Prometheus to every target in OpenShift user-workload monitoring;
- `arbiter_dev_decision_model` and `arbiter_dev_version`: the pod labels `arbiter.dev/decision-model` and
  `arbiter.dev/version`, copied onto the target by the PodMonitor's `podTargetLabels` (Prometheus replaces `.`,
  `/` and `-` by `_`).
Both vLLM's and the runtime's metrics come from the same pod, so one selector serves every query. The label names
are a parameter (`MetricLabels`) so a different monitoring setup can be matched without code changes.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Protocol

from arbiter_operator.api.promotion import AnalysisRun, PromoteSpec, PromotionStatus

# Runtime metric names (runtime/arbiter_runtime/metrics.py) and vLLM's.
DECISIONS_TOTAL = "arbiter_decisions_total"
DECISION_LATENCY_BUCKET = "arbiter_decision_latency_seconds_bucket"
VLLM_E2E_LATENCY_BUCKET = "vllm:e2e_request_latency_seconds_bucket"
# The `outcome` value of arbiter_decisions_total that counts as a failed decision.
ERROR_OUTCOME = "error"


@dataclass(frozen=True)
class MetricLabels:
    """Prometheus label names that identify a version's pods."""

    namespace: str = "namespace"
    model: str = "arbiter_dev_decision_model"
    version: str = "arbiter_dev_version"


DEFAULT_LABELS = MetricLabels()


@dataclass(frozen=True)
class AnalysisQuery:
    """One analysis to run: PromQL evaluated at `at`, and the bounds that judge the numbers."""

    version: str
    step: int
    at: datetime  # evaluation time (whole seconds, UTC); also the AnalysisRun's `at`
    window_seconds: int
    queries: Mapping[str, str]  # requests, errors, decision_p95, vllm_p95
    p95_bound_ms: float | None
    max_error_rate: float
    min_requests: int
    final: bool  # True at (or after) the end of the step's hold: a Pass advances; before, only a Fail acts


def _ts(value: datetime) -> str:
    return value.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    out = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return out if out.tzinfo else out.replace(tzinfo=timezone.utc)


def whole_seconds(now: datetime) -> datetime:
    """Status times have whole seconds; comparing against truncated `now` keeps step boundaries exact."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return now.astimezone(timezone.utc).replace(microsecond=0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def build_queries(
    namespace: str, model: str, version: str, window_seconds: int, labels: MetricLabels = DEFAULT_LABELS
) -> dict[str, str]:
    sel = (
        f'{labels.namespace}="{_escape(namespace)}",{labels.model}="{_escape(model)}",'
        f'{labels.version}="{_escape(version)}"'
    )
    w = f"[{window_seconds}s]"
    return {
        "requests": f"sum(increase({DECISIONS_TOTAL}{{{sel}}}{w}))",
        "errors": f'sum(increase({DECISIONS_TOTAL}{{{sel},outcome="{ERROR_OUTCOME}"}}{w}))',
        "decision_p95": f"histogram_quantile(0.95, sum by (le) (rate({DECISION_LATENCY_BUCKET}{{{sel}}}{w})))",
        "vllm_p95": f"histogram_quantile(0.95, sum by (le) (rate({VLLM_E2E_LATENCY_BUCKET}{{{sel}}}{w})))",
    }


def _last_for_step(status: PromotionStatus) -> AnalysisRun | None:
    last = status.lastAnalysis
    started = parse_time(status.stepStartedAt)
    if last is None or started is None or last.step != status.step:
        return None
    at = parse_time(last.at)
    return last if at is not None and at >= started else None


def next_analysis_at(spec: PromoteSpec, status: PromotionStatus | None) -> tuple[datetime, bool] | None:
    """When the current canary step's next analysis falls due, and whether it is the step's final one."""
    if (
        status is None
        or status.phase != "Progressing"
        or spec.strategy != "Canary"
        or status.candidate is None
        or not 0 <= status.step < len(spec.steps)
    ):
        return None
    started = parse_time(status.stepStartedAt)
    if started is None:
        return None
    interval = timedelta(seconds=spec.analysis.intervalSeconds)
    hold_end = started + timedelta(seconds=spec.steps[status.step].holdSeconds)
    last = _last_for_step(status)
    last_at = parse_time(last.at) if last else None
    if last_at is not None and last_at >= hold_end:
        # The final analysis ran and did not pass (NoData with Wait, or Inconclusive): ask again an interval later.
        return last_at + interval, True
    interim = (last_at or started) + interval
    if interim < hold_end:
        return interim, False
    return hold_end, True


def analysis_due(
    spec: PromoteSpec,
    status: PromotionStatus | None,
    now: datetime,
    *,
    namespace: str,
    model: str,
    sla_p95_ms: float | None = None,
    labels: MetricLabels = DEFAULT_LABELS,
) -> AnalysisQuery | None:
    """The analysis the observe layer must run before calling `advance`, or None when none is due.

    During a step's hold an analysis runs every `intervalSeconds` so a breach rolls back early; the analysis at the
    end of the hold decides whether the step passes.
    """
    due = next_analysis_at(spec, status)
    if due is None:
        return None
    at, _ = due
    now = whole_seconds(now)
    if now < at:
        return None
    assert status is not None and status.candidate is not None and status.stepStartedAt is not None
    # A late interim analysis (the operator woke after the hold ended) is the final one: label it by the clock.
    step_started = parse_time(status.stepStartedAt)
    hold_end = step_started + timedelta(seconds=spec.steps[status.step].holdSeconds)
    final = now >= hold_end
    # The window never reaches back before the step started: samples from the previous step, or from a failed attempt
    # of the same version before a retry (same series, still in Prometheus), must not judge this step.
    elapsed = int((now - step_started).total_seconds())
    window = max(1, min(spec.analysis.intervalSeconds, elapsed))
    bound = spec.analysis.p95LatencyMs if spec.analysis.p95LatencyMs is not None else sla_p95_ms
    return AnalysisQuery(
        version=status.candidate,
        step=status.step,
        at=now,
        window_seconds=window,
        queries=build_queries(namespace, model, status.candidate, window, labels),
        p95_bound_ms=bound,
        max_error_rate=spec.analysis.maxErrorRate,
        min_requests=spec.analysis.minRequests,
        final=final,
    )


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def judge(query: AnalysisQuery, values: Mapping[str, float | None], error: str | None = None) -> AnalysisRun:
    """Verdict from measured numbers. `values` maps query names to a number, or None for an empty result.

    An empty result or a NaN is "no data" and never a pass; the numbers count only with `min_requests` requests.
    """
    common: dict[str, Any] = dict(
        at=_ts(query.at),
        step=query.step,
        p95BoundMs=query.p95_bound_ms,
        maxErrorRate=query.max_error_rate,
        minRequests=query.min_requests,
        windowSeconds=query.window_seconds,
    )
    if error is not None:
        return AnalysisRun(verdict="Inconclusive", message=f"metrics query failed: {error}", **common)

    def num(name: str) -> float | None:
        v = values.get(name)
        return None if v is None or math.isnan(v) or math.isinf(v) else float(v)

    requests = num("requests")
    errors = num("errors")
    decision_p95, vllm_p95 = num("decision_p95"), num("vllm_p95")
    # The runtime's decision latency is the gate: it is what the SLA promises (it includes the model call) and its
    # buckets resolve milliseconds. vLLM's e2e histogram starts at a 300 ms bucket, so its p95 of a 40 ms model reads
    # ~285 ms; it gates only when the runtime exports no latency at all, and is always reported.
    p95 = decision_p95 * 1000.0 if decision_p95 is not None else (vllm_p95 * 1000.0 if vllm_p95 is not None else None)
    # A missing error series only means no decision has failed yet, as long as decisions were counted.
    error_rate = None if requests is None or requests <= 0 else (errors or 0.0) / requests
    common.update(requests=requests, p95LatencyMs=p95, errorRate=error_rate)
    window = f"{query.window_seconds}s"
    if requests is None or requests < query.min_requests:
        seen = "no decision metrics" if requests is None else f"{requests:.0f} requests"
        return AnalysisRun(
            verdict="NoData",
            message=f"{query.version}: {seen} in the last {window}, fewer than minRequests={query.min_requests}",
            **common,
        )
    if query.p95_bound_ms is not None and p95 is None:
        return AnalysisRun(
            verdict="NoData", message=f"{query.version}: no latency samples in the last {window}", **common
        )
    numbers = (
        f"p95 {_fmt(p95, 'ms')} (bound {_fmt(query.p95_bound_ms, 'ms')}), "
        f"error rate {_fmt(None if error_rate is None else error_rate * 100, '%', 2)} "
        f"(max {query.max_error_rate * 100:.2f}%), {requests:.0f} requests in {window}"
    )
    if vllm_p95 is not None and decision_p95 is not None:
        numbers += f"; vLLM e2e p95 {vllm_p95 * 1000.0:.1f}ms"

    breaches = []
    if error_rate is not None and error_rate > query.max_error_rate:
        breaches.append("error rate above maxErrorRate")
    if query.p95_bound_ms is not None and p95 is not None and p95 > query.p95_bound_ms:
        breaches.append("p95 latency above bound")
    if breaches:
        return AnalysisRun(verdict="Fail", message=f"{query.version}: {' and '.join(breaches)}: {numbers}", **common)
    return AnalysisRun(verdict="Pass", message=f"{query.version}: {numbers}", **common)


class InstantQuerier(Protocol):
    async def query(self, promql: str, at: datetime | None = None) -> list[tuple[dict[str, str], float]]: ...


async def run_analysis(prometheus_client: InstantQuerier, query: AnalysisQuery) -> AnalysisRun:
    """Run the query's PromQL at `query.at` and judge the numbers. Never raises for Prometheus trouble:
    an unreachable or failing Prometheus gives an Inconclusive run (which never passes a step)."""
    names = list(query.queries)
    # Concurrently: the analysis sits between the end of a hold and the Route switch.
    results = await asyncio.gather(
        *(prometheus_client.query(query.queries[n], at=query.at) for n in names), return_exceptions=True
    )
    values: dict[str, float | None] = {}
    for name, result in zip(names, results):
        if isinstance(result, BaseException):
            if isinstance(result, asyncio.CancelledError):
                raise result
            # Any client failure is an inconclusive analysis, not a crash.
            return judge(query, {}, error=_describe(result))
        values[name] = result[0][1] if result else None
    return judge(query, values)


def _describe(exc: BaseException) -> str:
    # The client's errors name the endpoint and status, never headers, so no token can leak here.
    text = str(exc) or type(exc).__name__
    return text[:300]
