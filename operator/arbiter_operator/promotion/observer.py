"""Observe-layer hook: runs the canary analysis `analysis_due` asks for, so `advance` gets its numbers.

handlers.py lists it in arbiter_operator.observe.OBSERVERS at start-up (after the artifact and registry hooks).
The Prometheus connection comes from the operator's environment (PrometheusConfig.from_env); the client is shared
and created on first use. Prometheus trouble never raises: it becomes an Inconclusive analysis, which never passes a step.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from arbiter_operator.clients.prometheus import PrometheusClient, PrometheusConfig
from arbiter_operator.promotion.analysis import VersionBounds, analysis_due, run_analysis

log = logging.getLogger("arbiter.promotion")
# httpx logs every request at INFO; the analysis line below already tells the story once per analysis.
logging.getLogger("httpx").setLevel(logging.WARNING)

_client: PrometheusClient | None = None


def _prometheus() -> PrometheusClient:
    global _client
    if _client is None:
        _client = PrometheusClient(PrometheusConfig.from_env(os.environ))
    return _client


def _sla(dm: Any, version: str) -> float | None:
    for v in dm.spec.versions:
        if v.name == version:
            return float(v.metadata.sla.p95LatencyMs)
    return None


def _bounds(dm: Any, version: str) -> VersionBounds | None:
    """The decision-quality bounds the candidate's metadata.sla promises (the analysis falls back on them)."""
    for v in dm.spec.versions:
        if v.name == version:
            sla = v.metadata.sla
            return VersionBounds(sla.maxFallbackRate, sla.maxSchemaViolationRate, sla.maxLowConfidenceRate)
    return None


async def observe_promotion_analysis(dm: Any, obs: Any) -> Any:
    promote = dm.spec.promote
    query = analysis_due(
        promote,
        dm.status.promotion,
        datetime.now(timezone.utc),
        namespace=dm.metadata.namespace,
        model=dm.metadata.name,
        sla_p95_ms=_sla(dm, promote.version),
        version_bounds=_bounds(dm, promote.version),
    )
    if query is None:
        return obs
    run = await run_analysis(_prometheus(), query)
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

