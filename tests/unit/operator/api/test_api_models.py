from __future__ import annotations

import pytest
from arbiter_operator.api.models import DecisionModel, isvc_name
from pydantic import ValidationError
from support.examples import example
from support.factory import make_dm


def test_example_parses_with_defaults():
    dm = make_dm()
    assert dm.spec.promote.version == "1.0.0"
    assert dm.spec.serving.gpuProduct is None  # no GPU product pinned by default: any GPU node
    assert dm.spec.serving.runtimeImage is None  # the operator's setting applies
    assert dm.spec.serving.vllm.seed == 42
    assert dm.spec.exposure.auth is True
    assert dm.spec.mesh.sidecar == "auto"
    assert dm.spec.versions[0].metadata.trainingData.from_ == "2024-01-01"
    assert dm.spec.storage.secretName == "storage-config"


def test_round_trip_uses_json_names():
    dm = make_dm()
    dumped = dm.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["spec"]["versions"][0]["metadata"]["trainingData"] == {"from": "2024-01-01", "to": "2025-06-30"}
    assert DecisionModel.model_validate(dumped) == dm


def test_unknown_field_is_an_error():
    raw = example()
    raw["spec"]["serving"]["gpuCount"] = 2
    with pytest.raises(ValidationError, match="gpuCount"):
        make_dm(raw)


def test_isvc_name_replaces_dots():
    assert isvc_name("credit-limit", "1.0.0") == "credit-limit--1-0-0"


def test_canary_example_parses():
    dm = make_dm(example("decisionmodel-canary.yaml"))
    assert dm.spec.promote.strategy == "Canary"
    assert [s.weight for s in dm.spec.promote.steps] == [10, 50]
    assert dm.spec.versions[1].decision.confidenceThreshold == 0.85
    assert dm.spec.versions[1].metadata.sla.p95LatencyMs == 150  # merged from the YAML anchor
    assert dm.spec.registry.modelRegistryRef.name == "modelregistry-public"
