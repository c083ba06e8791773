"""Bad input is rejected by the apiserver itself, with a message that says what to write instead."""

from __future__ import annotations

import pytest
from support.bad_specs import CASES, set_field
from support.operator_kit import example, rejection


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected_with_message(control_plane, namespace, case):
    edit, message = CASES[case]
    body = edit(example())
    api = control_plane.api_client()
    try:
        assert message in rejection(api, namespace, body)
    finally:
        api.close()


def test_example_is_accepted_and_defaulted(control_plane, namespace):
    from support.operator_kit import create_dm

    api = control_plane.api_client()
    try:
        created = create_dm(api, namespace, example())
    finally:
        api.close()
    spec = created["spec"]
    assert "gpuProduct" not in spec["serving"] and "runtimeImage" not in spec["serving"]
    assert spec["serving"]["vllm"]["gpuMemoryUtilization"] == 0.9
    assert spec["exposure"]["auth"] is True
    assert spec["mesh"]["sidecar"] == "auto"
    assert spec["promote"]["strategy"] == "Immediate"


def test_canary_example_is_accepted(control_plane, namespace):
    from support.operator_kit import create_dm

    api = control_plane.api_client()
    try:
        created = create_dm(api, namespace, example("decisionmodel-canary.yaml"))
    finally:
        api.close()
    assert created["spec"]["promote"]["steps"][1] == {"weight": 50, "holdSeconds": 300}


def test_abbreviated_managed_flag_is_reported_by_the_operator_and_nothing_is_deployed(
    control_plane, namespace, operator_process
):
    """`--tensor-parallel 3` passes CEL (argparse prefixes are beyond it) but vLLM reads it as
    --tensor-parallel-size: the operator refuses it with InvalidSpec and creates no InferenceService."""
    from kubernetes import client
    from support.operator_kit import condition, create_dm, eventually, get

    api = control_plane.api_client()
    try:
        operator_process(namespaces=[namespace])
        body = set_field("spec.serving.vllm.extraArgs", ["--tensor-parallel", "3"])(example())
        create_dm(api, namespace, body)

        def stalled():
            dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, "credit-limit")
            c = condition(dm or {}, "Stalled")
            return c if c and c["status"] == "True" else None

        c = eventually(stalled, 60, "Stalled=True")
        assert c["reason"] == "InvalidSpec"
        assert "'--tensor-parallel'" in c["message"] and "--tensor-parallel-size" in c["message"]
        isvcs = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", namespace, "inferenceservices")["items"]
        assert isvcs == []
    finally:
        api.close()
