"""The CRD file is generated from the models and is a structural schema the apiserver accepts."""

from __future__ import annotations

import subprocess
import sys

import yaml
from arbiter_operator.api import crdgen
from support.examples import ROOT


def test_crd_file_matches_models():
    assert crdgen.CRD_FILE.read_text() == crdgen.render(), (
        "crds/arbiter.dev_decisionmodels.yaml drifted from api/models.py: run python -m arbiter_operator.api.crdgen"
    )


def test_check_flag_fails_on_drift(tmp_path):
    stale = tmp_path / "crd.yaml"
    stale.write_text(crdgen.render().replace("p95LatencyMs", "p95LatencyMillis"))
    cmd = [sys.executable, "-m", "arbiter_operator.api.crdgen", "--check", "--output", str(stale)]
    drift = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert drift.returncode == 1
    assert "p95LatencyMillis" in drift.stdout
    stale.write_text(crdgen.render())
    assert subprocess.run(cmd, capture_output=True, cwd=ROOT).returncode == 0


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key in ("properties",):
            for name, sub in (node.get(key) or {}).items():
                yield from _walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    crd = yaml.safe_load(crdgen.CRD_FILE.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "const", "title", "nullable"):
            assert banned not in node, f"{path} uses {banned}"
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
            raise AssertionError(f"{path}: exclusiveMinimum must be a boolean in OpenAPI v3.0")


def test_crd_surface():
    crd = yaml.safe_load(crdgen.CRD_FILE.read_text())
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["dm"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:5] == ["Active", "Candidate", "Ready", "Reason", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    serving = spec["properties"]["serving"]["properties"]
    # Platform choices, not CRD defaults (apiserver defaulting would freeze them into every object).
    assert "default" not in serving["gpuProduct"] and "default" not in serving["runtimeImage"]
    assert serving["vllm"]["properties"]["maxNumSeqs"]["default"] == 64
    assert spec["properties"]["exposure"]["properties"]["auth"]["default"] is True
    assert spec["properties"]["mesh"]["properties"]["sidecar"]["enum"] == ["auto", "exclude-inbound", "disable", "none"]
    meta = spec["properties"]["versions"]["items"]["properties"]["metadata"]
    assert set(meta["required"]) == {"inputSchema", "outputSchema", "sla", "trainingData", "biasReportUrl"}
    assert meta["properties"]["inputSchema"]["x-kubernetes-preserve-unknown-fields"] is True
    # status is written whole by the operator: no apiserver defaults there
    assert all("default" not in node for _, node in _walk(version["schema"]["openAPIV3Schema"]["properties"]["status"]))
