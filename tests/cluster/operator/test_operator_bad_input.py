"""Bad input is rejected by the apiserver itself, with a message that says what to write instead."""

from __future__ import annotations

import copy

import pytest
from support.operator_kit import example, rejection


def _set(path: str, value):
    def edit(body):
        node = body
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node.setdefault(k, {})
        last = keys[-1]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
        return body
    return edit


_DELETE = object()


def _second_version(name):
    def edit(body):
        v2 = copy.deepcopy(body["spec"]["versions"][0])
        v2["name"] = name
        body["spec"]["versions"].append(v2)
        return body
    return edit


CASES = {
    "promote-unknown-version": (_set("spec.promote.version", "9.9.9"),
                                "spec.promote.version must name one of spec.versions[].name"),
    "gpus-3": (_set("spec.serving.gpus", 3), "spec.serving.gpus is the tensor parallel size and must be 1, 2, 4 or 8"),
    "swap-space": (_set("spec.serving.vllm.extraArgs", ["--swap-space=4"]),
                   "--swap-space was removed in vLLM 0.26"),
    "disable-log-requests": (_set("spec.serving.vllm.extraArgs", ["--disable-log-requests"]),
                             "--enable-log-requests turns logging on"),
    "guided-decoding-backend": (_set("spec.serving.vllm.extraArgs", ["--guided-decoding-backend", "xgrammar"]),
                                "set spec.serving.vllm.structuredOutputsBackend"),
    "tp-in-extra-args": (_set("spec.serving.vllm.extraArgs", ["--tensor-parallel-size=2"]),
                         "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "duplicate-version": (_second_version("1.0.0"), "Duplicate value"),
    "colliding-version-slug": (_second_version("1-0-0"), "spec.versions[].name must be unique"),
    "storage-uri-scheme": (_set("spec.versions.0.storageUri", "https://example.com/model"),
                           "storageUri must start with s3://, pvc:// or oci://"),
    "missing-bias-report": (_set("spec.versions.0.metadata.biasReportUrl", _DELETE),
                            "spec.versions[0].metadata.biasReportUrl: Required value"),
    "training-data-backwards": (_set("spec.versions.0.metadata.trainingData.to", "2023-01-01"),
                                "trainingData.to must not be before trainingData.from"),
    "canary-weights-decreasing": (_set("spec.promote.steps", [{"weight": 50}, {"weight": 10}]),
                                  "spec.promote.steps[].weight must be strictly increasing"),
    "canary-without-steps": (lambda b: _set("spec.promote.steps", [])(_set("spec.promote.strategy", "Canary")(b)),
                             "spec.promote.strategy Canary needs at least one entry"),
    "fallback-decision-unknown": (_set("spec.decision.fallbackRules.0.decision", "maybe"),
                                  "every decision.fallbackRules[].decision must be one of decision.labels"),
    "fallback-policy-without-rules": (_set("spec.decision.fallbackRules", []),
                                      "decision.lowConfidencePolicy 'fallback' needs at least one entry"),
    "registry-ref-and-url": (_set("spec.registry", {"url": "https://registry.example.com",
                                                    "modelRegistryRef": {"name": "modelregistry-public"}}),
                             "spec.registry needs exactly one of modelRegistryRef or url"),
    "tls-passthrough": (_set("spec.exposure.tls", "passthrough"), 'Unsupported value: "passthrough"'),
    "mesh-unknown": (_set("spec.mesh.sidecar", "off"), 'Unsupported value: "off"'),
    "memory-utilization-above-1": (_set("spec.serving.vllm.gpuMemoryUtilization", 1.5),
                                   "spec.serving.vllm.gpuMemoryUtilization: Invalid value: 1.5: spec.serving.vllm."
                                   "gpuMemoryUtilization in body should be less than or equal to 1"),
    "multi-node-replicas": (lambda b: _set("spec.serving.replicas", 2)(_set("spec.serving.nodes", 2)(b)),
                            "spec.serving.replicas must be 1 when spec.serving.nodes > 1"),
    "name-too-long": (_set("metadata.name", "a" * 50), "metadata.name plus each version name must be at most 46"),
    # 42 + len("1.0.0") = 47: the InferenceService would be 49 characters and KServe's label isvc.<isvc>-predictor 64.
    "name-one-too-long-for-kserves-label": (_set("metadata.name", "a" * 42),
                                             "app=isvc.<InferenceService>-predictor, a label value of at most 63"),
    "name-too-long-multi-node": (
        lambda b: _set("spec.serving.nodes", 2)(_set("metadata.name", "a" * 35)(b)),
        "with spec.serving.nodes > 1, metadata.name plus each version name must be at most 39",
    ),
    "name-with-dot": (_set("metadata.name", "credit.limit"), "KServe requires [a-z]([-a-z0-9]*[a-z0-9])?"),
    "name-leading-digit": (_set("metadata.name", "1credit"), "metadata.name must start with a letter"),
    "name-with-separator": (_set("metadata.name", "credit--limit"), "metadata.name must not contain '--'"),
    "tp-short-alias": (_set("spec.serving.vllm.extraArgs", ["-tp", "3"]),
                       "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "tp-underscores": (_set("spec.serving.vllm.extraArgs", ["--tensor_parallel_size=3"]),
                       "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "swap-space-underscore": (_set("spec.serving.vllm.extraArgs", ["--swap_space", "4"]),
                              "--swap-space was removed in vLLM 0.26"),
    "disable-log-requests-underscore": (_set("spec.serving.vllm.extraArgs", ["--disable_log_requests"]),
                                        "--disable-log-requests was removed in vLLM 0.26"),
    "structured-outputs-dotted": (_set("spec.serving.vllm.extraArgs", ["--structured_outputs_config.backend=x"]),
                                  "--structured-outputs-config is set by the operator"),
    "one-label": (_set("spec.decision.labels", ["approved"]), "spec.decision.labels: Invalid value"),
    "sequential-settings-without-the-mode": (_set("spec.promote.analysis", {"sequential": {"lookSeconds": 2}}),
                                             "spec.promote.analysis.sequential is read only with analysis.mode"),
    "sequential-with-failure-limit": (_set("spec.promote.analysis", {"mode": "Sequential", "failureLimit": 2}),
                                      "spec.promote.analysis.failureLimit must be 0 with analysis.mode: Sequential"),
}


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
        body = _set("spec.serving.vllm.extraArgs", ["--tensor-parallel", "3"])(example())
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
