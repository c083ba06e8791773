"""DecisionModels for the registry and artifact tests, built from examples/decisionmodel.yaml (what users start from)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

from arbiter_operator.api.models import DecisionModel

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "decisionmodel.yaml"


def make_dm(
    model: str,
    versions: list[str] | dict[str, str],
    *,
    namespace: str = "team-a",
    name: str = "credit-limit",
    uid: str = "0b6f4f7e-uid-1",
    generation: int = 1,
    sla_ms: float = 150,
    gpus: int = 1,
    max_model_len: int = 4096,
    architecture: str | None = "Qwen3ForCausalLM",
    registry: dict[str, Any] | None = None,
) -> DecisionModel:
    """`versions`: names (storageUri s3://models/<model>/<version>) or {name: storageUri}."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    template = doc["spec"]["versions"][0]
    uris = versions if isinstance(versions, dict) else {v: f"s3://models/{model}/{v}" for v in versions}
    doc["spec"]["versions"] = []
    for v, uri in uris.items():
        entry = copy.deepcopy(template)
        entry["name"] = v
        entry["storageUri"] = uri
        entry["metadata"]["sla"]["p95LatencyMs"] = sla_ms
        entry["metadata"]["biasReportUrl"] = f"https://governance.example.com/reports/{model}-{v}.html"
        doc["spec"]["versions"].append(entry)
    doc["spec"]["model"]["name"] = model
    doc["spec"]["model"]["architecture"] = architecture
    doc["spec"]["promote"]["version"] = next(iter(uris))
    doc["spec"]["serving"]["gpus"] = gpus
    doc["spec"]["serving"]["vllm"]["maxModelLen"] = max_model_len
    if registry is not None:
        doc["spec"]["registry"] = registry
    doc["metadata"].update(namespace=namespace, name=name, uid=uid, generation=generation)
    return DecisionModel.model_validate(doc)
