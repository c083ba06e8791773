"""The one DecisionModel factory: examples/decisionmodel.yaml (what users start from), validated by the operator's own
pydantic model, with the metadata a live object has and, where asked, other versions or serving settings."""

from __future__ import annotations

import copy
from typing import Any

from arbiter_operator.api.models import DecisionModel

from .examples import example

_UNSET: Any = object()
DEFAULT_META = {"namespace": "team-a", "uid": "0000-uid", "generation": 1}


def make_dm(
    raw: dict[str, Any] | None = None,
    *,
    model: str | None = None,
    versions: list[str] | dict[str, str] | None = None,
    sla_ms: float | None = None,
    gpus: int | None = None,
    max_model_len: int | None = None,
    architecture: str | None = _UNSET,
    registry: dict[str, Any] | None = None,
    **meta: Any,
) -> DecisionModel:
    """A DecisionModel from `raw` (default: the example), with namespace/uid/generation defaulted and `meta`
    (name, namespace, uid, generation, ...) applied to its metadata.

    `model` renames the model; `versions` replaces the versions with copies of the first, as names (storageUri
    s3://models/<model>/<version>) or {name: storageUri}, the first one promoted. `sla_ms` sets every version's p95
    latency SLA; `gpus`, `max_model_len`, `architecture` and `registry` set those spec fields.
    """
    doc = copy.deepcopy(raw) if raw is not None else example()
    spec = doc["spec"]
    if model is not None:
        spec["model"]["name"] = model
    if versions is not None:
        name = spec["model"]["name"]
        uris = versions if isinstance(versions, dict) else {v: f"s3://models/{name}/{v}" for v in versions}
        template = spec["versions"][0]
        spec["versions"] = []
        for version, uri in uris.items():
            entry = copy.deepcopy(template)
            entry["name"] = version
            entry["storageUri"] = uri
            entry["metadata"]["biasReportUrl"] = f"https://governance.example.com/reports/{name}-{version}.html"
            spec["versions"].append(entry)
        spec["promote"]["version"] = next(iter(uris))
    if sla_ms is not None:
        for entry in spec["versions"]:
            entry["metadata"]["sla"]["p95LatencyMs"] = sla_ms
    if gpus is not None:
        spec["serving"]["gpus"] = gpus
    if max_model_len is not None:
        spec["serving"]["vllm"]["maxModelLen"] = max_model_len
    if architecture is not _UNSET:
        spec["model"]["architecture"] = architecture
    if registry is not None:
        spec["registry"] = registry
    for key, value in DEFAULT_META.items():
        doc["metadata"].setdefault(key, value)
    doc["metadata"].update(meta)
    return DecisionModel.model_validate(doc)
