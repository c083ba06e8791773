"""The operator end to end with the registry and the artifact checks: real kube-apiserver, real Model Registry (on
PostgreSQL), real S3 (SeaweedFS), `python -m arbiter_operator` as a subprocess, and the real KServe controller with the
scheduler and kwok's simulated A100 nodes bringing the predictors up.

One operator and one namespace for the whole module (starting them is most of the cost); every test
uses its own DecisionModel and its own model name in the registry.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from arbiter_devenv.cluster import wait_default_service_account
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_operator.api.models import isvc_name
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from support.examples import example
from support.polling import eventually

pytestmark = pytest.mark.cluster

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
FINALIZER = "arbiter.dev/registry-archive"
RM_LABEL = "modelregistry.opendatahub.io/registered-model-id"
MV_LABEL = "modelregistry.opendatahub.io/model-version-id"

# Thirty-two attention heads and eight KV heads fit tensor parallel 1, 2, 4 and 8; twelve heads do not fit 8.
GOOD_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_hidden_layers": 4, "max_position_embeddings": 32768}
TWELVE_HEADS = dict(GOOD_CONFIG, num_attention_heads=12, num_key_value_heads=12)


# ---------------------------------------------------------------------------------------------- module fixtures


@pytest.fixture(scope="module")
def api(control_plane: Any) -> Iterator[k8s.ApiClient]:
    client = control_plane.api_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def ns(api: k8s.ApiClient) -> Iterator[str]:
    """One namespace for the module's operator (it watches a fixed list); deleted afterwards without waiting."""
    core = k8s.CoreV1Api(api)
    name = f"t-reg-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"arbiter.dev/test": "true"}}})
    wait_default_service_account(api, name)
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def bucket(s3_server: Any, api: k8s.ApiClient, ns: str) -> str:
    """Model directories on the S3 server and the namespace's storage-config Secret (KServe's form), as
    arbiter_devenv/local.py."""
    name = f"reg-e2e-{uuid.uuid4().hex[:8]}"
    s3 = s3_server.client()
    s3.create_bucket(Bucket=name)
    for prefix, config in (("good", GOOD_CONFIG), ("twelve-heads", TWELVE_HEADS)):
        s3.put_object(Bucket=name, Key=f"{prefix}/config.json", Body=json.dumps(config).encode())
        s3.put_object(Bucket=name, Key=f"{prefix}/model.safetensors", Body=b"\0" * 64)
    storage_secret(api, ns, s3_server, "storage-config")
    return name


def storage_secret(api: k8s.ApiClient, ns: str, s3_server: Any, name: str) -> None:
    entry = {"type": "s3", "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
             "endpoint_url": s3_server.endpoint_url, "region": s3_server.region, "verify_ssl": "0"}
    k8s.CoreV1Api(api).create_namespaced_secret(ns, {"metadata": {"name": name},
                                                     "stringData": {"default": json.dumps(entry)}})


@pytest.fixture(scope="module")
def operator(control_plane: Any, api: k8s.ApiClient, ns: str, bucket: str) -> Iterator[OperatorProcess]:
    # KServe's controller, the scheduler and kwok's simulated A100 nodes bring the predictors up.
    op = OperatorProcess(control_plane.kubeconfig, [ns]).start()
    try:
        yield op
    finally:
        op.stop()


# ---------------------------------------------------------------------------------------------- helpers


def dm_body(name: str, bucket: str, versions: dict[str, str], *, promote: str, registry_url: str | None = None,
            gpus: int = 1, secret: str = "storage-config") -> dict[str, Any]:
    """examples/decisionmodel.yaml with other versions (name -> directory in the bucket) and its own model name."""
    doc = example()
    template = doc["spec"]["versions"][0]
    doc["metadata"] = {"name": name}
    doc["spec"]["model"]["name"] = f"{name}-{uuid.uuid4().hex[:6]}"
    doc["spec"]["versions"] = []
    for v, prefix in versions.items():
        entry = copy.deepcopy(template)
        entry.update(name=v, storageUri=f"s3://{bucket}/{prefix}")
        doc["spec"]["versions"].append(entry)
    doc["spec"]["promote"]["version"] = promote
    doc["spec"]["serving"]["gpus"] = gpus
    doc["spec"]["storage"] = {"secretName": secret}
    if registry_url:
        doc["spec"]["registry"] = {"url": registry_url}
    return doc


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def get_dm(api: k8s.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return custom(api).get_namespaced_custom_object(G, V, ns, P, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_dm(api: k8s.ApiClient, ns: str, name: str, patch: dict[str, Any]) -> None:
    custom(api).patch_namespaced_custom_object(G, V, ns, P, name, patch)


def get_isvc(api: k8s.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return custom(api).get_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def cond(dm: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((dm or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def version_status(dm: dict[str, Any], version: str) -> dict[str, Any]:
    return next(v for v in dm["status"]["versions"] if v["name"] == version)


def wait(op: OperatorProcess, fn: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    return eventually(fn, timeout, what, interval=0.3, ignoring=(AssertionError, KeyError, StopIteration, TypeError),
                      context=lambda: "operator log:\n" + op.log()[-4000:])


def ready(api: k8s.ApiClient, ns: str, name: str) -> Callable[[], Any]:
    def check() -> Any:
        dm = get_dm(api, ns, name)
        ok = dm and cond(dm, "Ready").get("status") == "True" and dm["status"].get("observedGeneration") == dm[
            "metadata"]["generation"]
        return dm if ok else None
    return check


def registry_get(registry: Any, path: str) -> dict[str, Any]:
    resp = httpx.get(f"{registry.api_url}{path}", timeout=5)
    resp.raise_for_status()
    return resp.json()


def state(registry: Any, kind: str, id_: str) -> str:
    return registry_get(registry, f"/{kind}/{id_}")["state"]


# ---------------------------------------------------------------------------------------------- tests


def test_register_label_archive_on_removal_and_on_delete(operator, api, ns, bucket, model_registry):
    name = "credit"
    custom(api).create_namespaced_custom_object(G, V, ns, P, dm_body(
        name, bucket, {"1.0.0": "good", "1.1.0": "good"}, promote="1.0.0", registry_url=model_registry.url))

    dm = wait(operator, lambda: (d := ready(api, ns, name)()) and cond(d, "Registered").get("status") == "True" and d,
              "Ready and Registered")
    assert cond(dm, "Registered")["reason"] == "Registered"
    v1, v11 = version_status(dm, "1.0.0"), version_status(dm, "1.1.0")
    assert v1["registeredModelId"] == v11["registeredModelId"]
    assert v1["modelVersionId"] != v11["modelVersionId"] and v1["modelArtifactId"]
    # The registry holds what status says: the version, its artifact URI and the governance metadata.
    mv = registry_get(model_registry, f"/model_versions/{v1['modelVersionId']}")
    assert (mv["name"], mv["state"]) == ("1.0.0", "LIVE")
    assert mv["customProperties"]["arbiter.decisionmodel_name"]["string_value"] == name
    art = registry_get(model_registry, f"/model_artifacts/{v1['modelArtifactId']}")
    assert art["uri"] == f"s3://{bucket}/good"
    # OpenShift AI links the deployment to the entry through these labels.
    labels = get_isvc(api, ns, isvc_name(name, "1.0.0"))["metadata"]["labels"]
    assert (labels[RM_LABEL], labels[MV_LABEL]) == (v1["registeredModelId"], v1["modelVersionId"])
    assert FINALIZER in dm["metadata"].get("finalizers", [])  # the registry is outside the cluster

    # A version removed from the spec is archived, not deleted.
    patch_dm(api, ns, name, {"spec": {"versions": [dm["spec"]["versions"][0]]}})
    wait(operator, lambda: state(model_registry, "model_versions", v11["modelVersionId"]) == "ARCHIVED",
         "1.1.0 archived in the registry")
    assert state(model_registry, "model_versions", v1["modelVersionId"]) == "LIVE"

    # Deleting the DecisionModel archives the rest; the finalizer then lets it go.
    custom(api).delete_namespaced_custom_object(G, V, ns, P, name)
    wait(operator, lambda: get_dm(api, ns, name) is None, "the DecisionModel gone")
    assert state(model_registry, "model_versions", v1["modelVersionId"]) == "ARCHIVED"
    assert state(model_registry, "registered_models", v1["registeredModelId"]) == "ARCHIVED"
    assert registry_get(model_registry, f"/model_versions/{v11['modelVersionId']}")["name"] == "1.1.0"  # kept


def test_registry_outage_keeps_serving_and_holds_the_delete(operator, api, ns, bucket, model_registry):
    name = "outage"
    custom(api).create_namespaced_custom_object(G, V, ns, P, dm_body(
        name, bucket, {"1.0.0": "good"}, promote="1.0.0", registry_url=model_registry.url))
    dm = wait(operator, lambda: (d := ready(api, ns, name)()) and cond(d, "Registered").get("status") == "True" and d,
              "Ready and Registered")
    ids = version_status(dm, "1.0.0")
    isvc_before = get_isvc(api, ns, isvc_name(name, "1.0.0"))

    model_registry.pause()
    try:
        # An outage is seen at the next reconcile; any change to the object brings one.
        patch_dm(api, ns, name, {"metadata": {"annotations": {"test.arbiter.dev/poke": "1"}}})
        dm = wait(operator, lambda: (d := get_dm(api, ns, name)) and cond(d, "Registered").get("status") == "Unknown"
                  and d, "Registered=Unknown")
        assert cond(dm, "Registered")["reason"] == "RegistryUnreachable"
        assert cond(dm, "Serving")["status"] == "True" and cond(dm, "Ready")["status"] == "True"
        assert version_status(dm, "1.0.0")["modelVersionId"] == ids["modelVersionId"]  # kept from status
        isvc = get_isvc(api, ns, isvc_name(name, "1.0.0"))
        assert isvc["metadata"]["generation"] == isvc_before["metadata"]["generation"]
        assert isvc["metadata"]["labels"] == isvc_before["metadata"]["labels"]
    finally:
        model_registry.resume()
    # Back without anything touching the object: the Unknown condition brings the reconcile back by itself.
    wait(operator, lambda: cond(get_dm(api, ns, name), "Registered").get("status") == "True", "Registered=True again")

    model_registry.pause()
    try:
        custom(api).delete_namespaced_custom_object(G, V, ns, P, name)
        dm = wait(operator, lambda: (d := get_dm(api, ns, name)) and cond(d, "Registered").get("status") == "Unknown"
                  and d, "the failed archive reported on the object")
        assert dm["metadata"].get("deletionTimestamp") and FINALIZER in dm["metadata"]["finalizers"]
        assert state_while_down_is_unknowable(model_registry)
    finally:
        model_registry.resume()
    wait(operator, lambda: get_dm(api, ns, name) is None, "the DecisionModel gone once the registry is back")
    assert state(model_registry, "model_versions", ids["modelVersionId"]) == "ARCHIVED"


def state_while_down_is_unknowable(registry: Any) -> bool:
    """The registry really is down (the held delete is not just slow)."""
    try:
        httpx.get(f"{registry.api_url}/registered_models", timeout=2)
    except httpx.HTTPError:
        return True
    return False


def test_a_registry_that_never_existed_does_not_hold_the_delete(operator, api, ns, bucket):
    name = "nowhere"
    body = dm_body(name, bucket, {"1.0.0": "good"}, promote="1.0.0")
    body["spec"]["registry"] = {"modelRegistryRef": {"name": "no-such-registry"}}
    custom(api).create_namespaced_custom_object(G, V, ns, P, body)
    dm = wait(operator, lambda: (d := get_dm(api, ns, name)) and cond(d, "Registered")
              and FINALIZER in d["metadata"].get("finalizers", []) and d, "Registered reported, finalizer set")
    assert (cond(dm, "Registered")["status"], cond(dm, "Registered")["reason"]) == ("Unknown", "RegistryUnreachable")
    custom(api).delete_namespaced_custom_object(G, V, ns, P, name)
    wait(operator, lambda: get_dm(api, ns, name) is None, "deleted: nothing was ever registered")


def test_failing_artifacts_deploy_nothing_and_carry_no_finalizer(operator, api, ns, bucket):
    name = "tp"
    custom(api).create_namespaced_custom_object(G, V, ns, P, dm_body(
        name, bucket, {"1.0.0": "good", "2.0.0": "twelve-heads"}, promote="1.0.0", gpus=8))
    dm = wait(operator, ready(api, ns, name), "1.0.0 Ready")
    # Without spec.registry nothing outside the cluster needs cleaning up: no finalizer, no kopf annotations.
    assert not dm["metadata"].get("finalizers")
    assert not [a for a in dm["metadata"].get("annotations") or {} if a.startswith("arbiter.dev/")]

    patch_dm(api, ns, name, {"spec": {"promote": {"version": "2.0.0"}}})
    dm = wait(operator, lambda: (d := get_dm(api, ns, name)) and cond(d, "ArtifactsValid").get("status") == "False"
              and cond(d, "Promoted").get("reason") == "ArtifactsInvalid" and d, "ArtifactsValid=False")
    art = cond(dm, "ArtifactsValid")
    assert art["reason"] == "TensorParallelMismatch"
    assert "tensor parallel 8 does not divide 12 attention heads; use 1, 2 or 4" in art["message"]
    assert version_status(dm, "2.0.0")["phase"] == "Invalid"
    assert get_isvc(api, ns, isvc_name(name, "2.0.0")) is None
    assert cond(dm, "Serving")["message"] == "Serving 1.0.0 100%"
    custom(api).delete_namespaced_custom_object(G, V, ns, P, name)


def test_storage_secret_created_late_deploys_without_a_retry(operator, api, ns, bucket, s3_server):
    name = "late"
    custom(api).create_namespaced_custom_object(G, V, ns, P, dm_body(
        name, bucket, {"1.0.0": "good"}, promote="1.0.0", secret="late-storage"))
    dm = wait(operator, lambda: (d := get_dm(api, ns, name)) and cond(d, "ArtifactsValid") and d,
              "ArtifactsValid reported")
    art = cond(dm, "ArtifactsValid")
    assert (art["status"], art["reason"]) == ("Unknown", "StorageCredentialsInvalid")
    assert "Secret late-storage not found" in art["message"]
    assert get_isvc(api, ns, isvc_name(name, "1.0.0")) is None
    assert dm["status"]["promotion"]["phase"] == "Deploying"  # waiting, not Failed

    storage_secret(api, ns, s3_server, "late-storage")
    dm = wait(operator, ready(api, ns, name), "Ready once the Secret exists")
    assert cond(dm, "ArtifactsValid")["status"] == "True"
    assert not dm["status"]["promotion"].get("failureReason")
    custom(api).delete_namespaced_custom_object(G, V, ns, P, name)
