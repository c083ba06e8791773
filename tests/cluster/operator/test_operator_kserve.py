"""What the operator renders, against the real KServe controller and webhooks, the scheduler and kwok's simulated
A100 nodes: admitted unchanged, no diff fight with KServe's defaulting, predictor pods that carry what we meant, the
storage initializer reading the credentials the artifact check used, and scheduling causes on the DecisionModel."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from typing import Any

import pytest
from arbiter_devenv.kwok import A100, NodePool
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.apply import needs_apply, with_hash
from arbiter_operator.kube.client import RestKubeClient
from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice, render_servingruntime
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"
ISVC = "credit-limit--1-0-0"


def _model(raw: dict[str, Any], namespace: str) -> DecisionModel:
    raw = copy.deepcopy(raw)
    raw["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), generation=1)
    return DecisionModel.model_validate(raw)


def _apply(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply with the operator's own client (field manager, force), through KServe's webhooks."""
    return asyncio.run(_aapply(RestKubeClient(api), _strip_owner(obj)))  # the DecisionModel is not created here


async def _aapply(kube: RestKubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    try:
        return await kube.aapply(obj, force=True)
    finally:
        await kube.close()


def _strip_owner(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("ownerReferences", None)
    return out


VARIANTS = {
    "tp1": {},
    "tp2": {"serving": {"gpus": 2}},
    "tp4": {"serving": {"gpus": 4}},
    "tp8": {"serving": {"gpus": 8}},
    # KServe's multi-node predictor loads only pvc:// and oci:// (the CRD says so too).
    "pipeline-2-nodes": {"serving": {"gpus": 8, "nodes": 2}, "storageUri": "pvc://models-pvc/credit-limit/1.0.0"},
    "mesh-exclude": {"mesh": {"sidecar": "exclude-inbound"}},
    "mesh-disable": {"mesh": {"sidecar": "disable"}},
    "mesh-none": {"mesh": {"sidecar": "none"}},
    "auth-off": {"exposure": {"auth": False}},
    "storage-key-endpoint": {"storage": {"key": "models", "endpoint": "http://minio.example:9000", "region": "eu-1"}},
    "pvc": {"storageUri": "pvc://models-pvc/credit-limit/1.0.0"},
    "oci": {"storageUri": "oci://quay.io/acme/credit-limit:1.0.0"},
    "fp8": {"serving": {"gpuProduct": A100, "vllm": {"quantization": "fp8", "kvCacheDtype": "fp8"}}},
}


def _variant(name: str) -> dict[str, Any]:
    raw = example()
    change = copy.deepcopy(VARIANTS[name])
    uri = change.pop("storageUri", None)
    for key, value in change.items():
        raw["spec"].setdefault(key, {}).update(value)
    if uri:
        raw["spec"]["versions"][0]["storageUri"] = uri
    return raw


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendering_is_admitted_unchanged_and_stays_converged(control_plane, namespace, api, variant):
    dm = _model(_variant(variant), namespace)
    version = dm.spec.versions[0]
    cm = render_configmap(dm, version)
    # Standard: the name KServe 0.17 keeps (its webhook rewrites a first write's RawDeployment, which the operator
    # then renders: test_operator_openshift_ai.py).
    desired = [with_hash(render_servingruntime(dm)),
               with_hash(render_inferenceservice(PredictorInputs(dm, version, cm, {"istio-injection": "enabled"},
                                                                 deployment_mode="Standard")))]
    for obj in desired:
        first = _apply(api, obj)  # KServe's validating webhooks would refuse it here
        # KServe's defaulting webhook may add fields, never change ours: what we sent is all still there...
        assert not needs_apply(_strip_owner(obj), first), json.dumps(first.get("spec"), indent=1)[:3000]
        # ...so a converged reconcile sees nothing to write, and re-applying changes no spec (KServe's controller may
        # meanwhile add its finalizer and write status; the generation counts spec changes only).
        again = _apply(api, obj)
        assert not needs_apply(_strip_owner(obj), again)
        assert again["metadata"].get("generation") == first["metadata"].get("generation")


def _pods(api: client.ApiClient, namespace: str, isvc: str) -> list[client.V1Pod]:
    return client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"serving.kserve.io/inferenceservice={isvc}").items


def test_predictor_pods_forbidden_by_pod_security_are_a_failed_cause(
    control_plane, namespace, api, operator_process, predictors
):
    """KServe injects its storage-initializer container without a securityContext; OpenShift's restricted-v2 SCC
    fills one in, plain Pod Security admission at `restricted` refuses the pod. The DecisionModel says so."""
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    serving = eventually(lambda: (s := _serving(api, namespace)).get("reason") == "FailedCreate" and s, 90,
                         "Serving=False/FailedCreate")
    assert 'violates PodSecurity "restricted:latest"' in serving["message"], serving
    assert 'container "storage-initializer"' in serving["message"], serving  # KServe's container, not ours
    assert 'container "kserve-container"' not in serving["message"], serving


def test_predictor_pod_carries_what_we_meant(
    control_plane, namespace, api, operator_process, predictors, s3_server
):
    core = client.CoreV1Api(api)
    raw = example()
    raw["spec"]["serving"]["gpus"] = 2
    raw["spec"]["serving"]["vllm"].update(quantization="fp8", kvCacheDtype="fp8")  # FP8 weights and KV cache
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, raw)
    dm = eventually(lambda: (d := get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM))
                    and (condition(d, "Ready") or {}).get("status") == "True" and d, 90, "Ready")
    assert dm["status"]["versions"][0]["phase"] == "Ready"

    pods = [p for p in _pods(api, namespace, ISVC) if p.status.phase == "Running"]
    assert len(pods) == 1, [p.status.phase for p in pods]
    pod = pods[0]
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == A100  # placed by the scheduler on a GPU node

    serving = next(c for c in pod.spec.containers if c.name == "kserve-container")
    assert serving.resources.limits["nvidia.com/gpu"] == "2" and serving.resources.requests["nvidia.com/gpu"] == "2"
    assert "--tensor-parallel-size=2" in serving.args and "--port=8000" in serving.args
    assert "--quantization=fp8" in serving.args and "--kv-cache-dtype=fp8" in serving.args
    assert serving.args[0] == "/mnt/models"
    assert any(m.mount_path == "/dev/shm" for m in serving.volume_mounts)
    shm = next(v for v in pod.spec.volumes if v.name == "shm")
    assert shm.empty_dir.medium == "Memory"
    assert [(p.container_port, p.name) for p in serving.ports] == [(8080, "http1")]
    assert serving.startup_probe.http_get.path == "/v2/health/live"
    assert serving.readiness_probe.http_get.path == "/v2/health/ready"
    assert serving.readiness_probe.http_get.port in (8080, "8080")
    # Our container meets the restricted profile (the pod-level fields cover every container).
    sc = serving.security_context
    assert sc.allow_privilege_escalation is False and sc.capabilities.drop == ["ALL"]
    assert not sc.privileged and not (sc.capabilities.add or [])
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert not pod.spec.host_network and not pod.spec.host_pid

    # The predictor Service KServe made targets the serving port; the Route points at it.
    svc = core.read_namespaced_service(f"{ISVC}-predictor", namespace)
    assert {p.target_port for p in svc.spec.ports} == {8080}
    route = get(api, "route.openshift.io/v1", "routes", namespace, DM)
    assert route["spec"]["to"]["name"] == f"{ISVC}-predictor"


def test_private_bucket_reaches_the_storage_initializer_with_the_validated_credentials(
    control_plane, namespace, api, operator_process, predictors, s3_server
):
    """The storage-config entry the artifact check read (here the one named after the bucket, not `default`) is the
    one KServe's pod mutator hands the storage initializer, with the same bucket and path."""
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret("storage-config", namespace)
    entry = json.loads(__import__("base64").b64decode(secret.data["default"]))
    # A second, per-bucket entry with the working key; `default` gets a wrong key: only the bucket entry can read.
    bad = dict(entry, secret_access_key="not-the-key")
    core.patch_namespaced_secret("storage-config", namespace, {"stringData": {
        "models": json.dumps(entry), "default": json.dumps(bad)}})
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: (d := get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM))
               and (condition(d, "Ready") or {}).get("status") == "True", 90, "Ready")

    isvc = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC)
    assert isvc["spec"]["predictor"]["model"]["storage"]["key"] == "models"
    pod = next(p for p in _pods(api, namespace, ISVC) if p.status.phase == "Running")
    init = next(c for c in pod.spec.init_containers or [] if c.name == "storage-initializer")
    assert init.args[0] == "s3://models/credit-limit/1.0.0", init.args
    env = {e.name: e for e in init.env or []}
    ref = env["STORAGE_CONFIG"].value_from.secret_key_ref
    assert (ref.name, ref.key) == ("storage-config", "models")
    assert json.loads(env["STORAGE_OVERRIDE_CONFIG"].value) == {"type": "s3", "bucket": "models"}
    # What that reference resolves to is what the operator validated with: the endpoint and the working key.
    secret = core.read_namespaced_secret(ref.name, namespace)
    resolved = json.loads(__import__("base64").b64decode(secret.data[ref.key]))
    assert resolved["endpoint_url"] == s3_server.endpoint_url
    assert resolved["secret_access_key"] == s3_server.secret_key
    assert pod.status.init_container_statuses[0].state.terminated.reason == "Completed"


def _serving(api, namespace, name=DM):
    dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, name)
    return condition(dm or {}, "Serving") or {}


def test_eight_gpus_on_four_gpu_nodes_is_unschedulable_with_the_schedulers_message(
    control_plane, namespace, api, operator_process, predictors
):
    control_plane.add_pool(NodePool("a100x4", 2, gpus=4, gpu_product="NVIDIA-A100-SXM4-40GB", cpu="64"))
    raw = example()
    raw["spec"]["serving"].update(gpus=8, gpuProduct="NVIDIA-A100-SXM4-40GB")
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, raw)
    serving = eventually(lambda: (s := _serving(api, namespace)).get("reason") == "Unschedulable" and s, 90,
                         "Serving=False/Unschedulable")
    assert serving["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in serving["message"], serving  # the scheduler's own words
    assert f"{ISVC}-predictor-" in serving["message"]  # the pending pod, by name
    dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM)
    assert condition(dm, "Ready")["status"] == "False"


def test_gpu_product_no_node_has_is_unschedulable(control_plane, namespace, api, operator_process, predictors):
    raw = example()
    raw["spec"]["serving"]["gpuProduct"] = "NVIDIA-B200"
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, raw)
    serving = eventually(lambda: (s := _serving(api, namespace)).get("reason") == "Unschedulable" and s, 90,
                         "Serving=False/Unschedulable")
    assert "didn't match Pod's node affinity/selector" in serving["message"], serving


def test_multi_node_with_s3_storage_is_refused_by_the_crd(control_plane, namespace, api):
    """KServe's validator refuses a multi-node predictor with an s3:// storageUri; the CRD says so first."""
    from support.operator_kit import rejection

    raw = example()
    raw["spec"]["serving"].update(gpus=8, nodes=2)
    message = rejection(api, namespace, raw)
    assert "spec.serving.nodes > 1 needs pvc:// or oci://" in message
