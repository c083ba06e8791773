"""The per-version ConfigMap holding `decision.json`, the runtime's contract (docs/architecture.md)."""

from __future__ import annotations

import functools
import json
from typing import Any

from arbiter_runtime.contract import DecisionJson, read_decision_json

from ..api.models import DecisionModel, ModelVersion, effective_decision
from ..api.names import CORE_API
from .common import (
    CONFIG_FILE,
    ROUTING_FILE,
    SHADOW_FILE,
    VLLM_PORT,
    configmap_name,
    metadata,
    predictor_service,
)

# How long the version that forwards a pinned context waits for the version that decides it, beyond that version's
# own decision deadline (its queue, a slow network).
ROUTING_SLACK_MS = 5000


def decision_json(dm: DecisionModel, version: ModelVersion, diffusion: bool = False) -> DecisionJson:
    """The version's decision.json, built through the model the runtime reads it with (arbiter_runtime.contract).
    Raises DecisionJsonError where the runtime would refuse it (e.g. a version's labels override that leaves a
    fallback rule deciding a label it no longer has); plan/validate.py reports that as InvalidSpec first."""
    d = effective_decision(dm.spec.decision, version)
    meta = version.metadata
    fields: dict[str, Any] = {
        "model": dm.spec.model.name,
        "version": version.name,
        "labels": list(d.labels),
        "reasoningCodes": list(d.reasoningCodes),
        "steps": d.steps,
        "trajectoryMode": d.trajectoryMode,
        "scoredFormat": d.scoredFormat,
        "confidenceThreshold": d.confidenceThreshold,
        "lowConfidencePolicy": d.lowConfidencePolicy,
        "deadlineMs": d.deadlineMs,
        "inputSchema": meta.inputSchema,
        "outputSchema": meta.outputSchema,
        "fallbackRules": [r.model_dump(exclude_none=True) for r in d.fallbackRules],
        "sla": {"p95LatencyMs": meta.sla.p95LatencyMs},
        "upstream": {"url": f"http://127.0.0.1:{VLLM_PORT}/v1", "servedModelName": dm.spec.model.name},
    }
    if diffusion:
        fields["diffusion"] = True
    return read_decision_json(fields)


def decision_config(dm: DecisionModel, version: ModelVersion, diffusion: bool = False) -> dict[str, Any]:
    """decision.json as JSON values: only the keys the operator sets (the rest are the runtime's defaults)."""
    return decision_json(dm, version, diffusion).to_json()


def shadow_config(dm: DecisionModel, shadow: Any) -> dict[str, Any]:
    """shadow.json: where the stable version's runtime mirrors a sample of its requests (the candidate's predictor
    Service, in-cluster), how many and how long it waits. The runtime re-reads it live."""
    ns = dm.metadata.namespace
    return {
        "candidate": shadow.candidate,
        "url": f"http://{predictor_service(dm.metadata.name, shadow.candidate)}.{ns}.svc.cluster.local",
        "sampleRate": shadow.sample_rate,
        "timeoutMs": shadow.timeout_ms,
        "maxInFlight": shadow.max_in_flight,
    }


def routing_config(dm: DecisionModel) -> dict[str, Any] | None:
    """routing.json: every pinned context and where its version's runtime listens (its predictor Service,
    in-cluster); each runtime leaves out the routes to itself. None without spec.routing contexts."""
    routing = dm.spec.routing
    if routing is None or not routing.contexts:
        return None
    by_name = {v.name: v for v in dm.spec.versions}
    ns = dm.metadata.namespace
    routes = []
    for c in routing.contexts:
        version = by_name.get(c.version)
        if version is None:
            continue  # the CRD refuses it; an object admitted without the CRD's rules routes nothing there
        routes.append({
            "header": c.header.lower(), "value": c.value, "version": c.version,
            "url": f"http://{predictor_service(dm.metadata.name, c.version)}.{ns}.svc.cluster.local",
            "timeoutMs": effective_decision(dm.spec.decision, version).deadlineMs + ROUTING_SLACK_MS,
        })
    return {"routes": routes}


def readable_json(value: Any) -> str:
    """Sorted, indented JSON: stable bytes (so the checksum only moves when content does) and readable in `oc get`.
    Exactly `json.dumps(value, sort_keys=True, indent=2)`, whose bytes must never change (the pods' config checksum
    is taken over them); the standard library encodes with indentation in pure Python, so each text is made once
    and found again by the compact form, which it encodes in C."""
    return _indented(json.dumps(value, sort_keys=True, separators=(",", ":")))


@functools.lru_cache(maxsize=2048)
def _indented(compact: str) -> str:
    return json.dumps(json.loads(compact), sort_keys=True, indent=2)


def render_configmap(
    dm: DecisionModel, version: ModelVersion, diffusion: bool = False, shadow: Any = None
) -> dict[str, Any]:
    """shadow: a promotion.ShadowPlan when this (stable) version mirrors traffic to a candidate; without it the
    ConfigMap has no shadow.json, so server-side apply removes the key and mirroring stops. routing.json: the pinned
    contexts (spec.routing), in every version's ConfigMap, gone with the last of them."""
    cfg = decision_config(dm, version, diffusion)
    data = {CONFIG_FILE: readable_json(cfg)}
    if shadow is not None:
        data[SHADOW_FILE] = readable_json(shadow_config(dm, shadow))
    routes = routing_config(dm)
    if routes is not None:
        data[ROUTING_FILE] = readable_json(routes)
    return {
        "apiVersion": CORE_API,
        "kind": "ConfigMap",
        "metadata": metadata(dm, configmap_name(dm.metadata.name, version.name), "decision-config", version.name),
        "data": data,
    }
