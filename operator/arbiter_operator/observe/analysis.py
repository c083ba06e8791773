"""The canary analysis a promotion step is due (Prometheus): runs the PromQL `promotion.analysis.analysis_due` built,
and hands the numbers to `promotion.analysis.judge`, so `advance` gets its verdict.

The Prometheus connection comes from the operator's settings (PrometheusConfig.from_env at start-up). Prometheus
trouble never raises: it becomes an Inconclusive analysis, which never passes a step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from ..api.models import DecisionModel
from ..api.promotion import AnalysisRun
from ..plan.model import Observations
from ..promotion.analysis import AnalysisQuery, VersionBounds, analysis_due, as_number, judge

log = logging.getLogger("arbiter.promotion")


class InstantQuerier(Protocol):
    async def query(self, promql: str, at: datetime | None = None,
                    namespace: str | None = None) -> list[tuple[dict[str, str], float]]: ...


async def run_analysis(prometheus_client: InstantQuerier, query: AnalysisQuery,
                       namespace: str | None = None) -> AnalysisRun:
    """Run the query's PromQL at `query.at` and judge the numbers. Never raises for Prometheus trouble:
    an unreachable or failing Prometheus gives an Inconclusive run (which never passes a step).
    namespace: the DecisionModel's, whose series the PromQL reads (Thanos Querier's tenancy port answers for it)."""
    names = list(query.queries) + list(query.vectors)
    promql = {**query.queries, **{n: v.promql for n, v in query.vectors.items()}}
    where = {"namespace": namespace} if namespace else {}
    # Concurrently: the analysis sits between the end of a hold and the Route switch.
    results = await asyncio.gather(
        *(prometheus_client.query(promql[n], at=query.at, **where) for n in names), return_exceptions=True
    )
    values: dict[str, Any] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, BaseException):
            if isinstance(result, asyncio.CancelledError):
                raise result
            # Any client failure is an inconclusive analysis, not a crash; the message names the query that failed
            # (a custom check's PromQL is the user's text, and Prometheus's parse error is only useful next to it).
            return judge(query, {}, error=f"{_query_title(name)}: {_describe(result)}")
        if name in query.vectors:
            values[name] = _vector(result, query.vectors[name].by)
        else:
            values[name] = _first(result)
    return judge(query, values)


def _samples(result: Any) -> list[Any]:
    if not isinstance(result, (list, tuple)):
        return []
    return [r for r in result if isinstance(r, (list, tuple)) and len(r) == 2]


def _first(result: Any) -> Any:
    samples = _samples(result)
    return samples[0][1] if samples else None


def _vector(result: Any, by: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in _samples(result):
        if not isinstance(labels, Mapping):
            continue
        key = "->".join(str(labels.get(b, "")) for b in by)
        n = as_number(value)
        if n is not None and n >= 0:
            out[key] = out.get(key, 0.0) + n
    return out


def _query_title(name: str) -> str:
    kind, _, check = name.partition(":")
    return f"check {check}" if kind == "check" and check else f"{name} query"


def _describe(exc: BaseException) -> str:
    # The client's errors name the endpoint and status, never headers, so no token can leak here.
    text = str(exc) or type(exc).__name__
    return text[:300]


def _sla(dm: DecisionModel, version: str) -> float | None:
    for v in dm.spec.versions:
        if v.name == version:
            return float(v.metadata.sla.p95LatencyMs)
    return None


def _bounds(dm: DecisionModel, version: str) -> VersionBounds | None:
    """The decision-quality bounds the candidate's metadata.sla promises (the analysis falls back on them)."""
    for v in dm.spec.versions:
        if v.name == version:
            sla = v.metadata.sla
            return VersionBounds(sla.maxFallbackRate, sla.maxSchemaViolationRate, sla.maxLowConfidenceRate)
    return None


async def observe_promotion_analysis(
    prometheus: InstantQuerier, dm: DecisionModel, obs: Observations, now: datetime
) -> Observations:
    """The analysis run `analysis_due` asks for at `now` (the reconcile's one clock), in `obs.analysis`."""
    promote = dm.spec.promote
    if promote is None:
        return obs
    query = analysis_due(
        promote,
        dm.status.promotion,
        now,
        namespace=dm.metadata.namespace,
        model=dm.metadata.name,
        sla_p95_ms=_sla(dm, promote.version),
        version_bounds=_bounds(dm, promote.version),
    )
    if query is None:
        return obs
    run = await run_analysis(prometheus, query, dm.metadata.namespace)
    log.info(
        "%s/%s analysis of %s %s (%s): %s: %s",
        dm.metadata.namespace,
        dm.metadata.name,
        query.version,
        "shadow" if query.shadow else f"step {query.step + 1}",
        "final" if query.final else "interim",
        run.verdict,
        run.message,
    )
    return replace(obs, analysis=run)
