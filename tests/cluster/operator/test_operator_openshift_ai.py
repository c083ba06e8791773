"""Beside OpenShift AI's controllers, on the real apiserver with KServe v0.17's controller and webhooks:

- KServe's deployment mode: the operator's first write says `RawDeployment` (every KServe line deploys it as a
  plain Deployment), KServe 0.17's webhook answers `Standard`, and from then on the operator renders `Standard`:
  its next version is created under that name, and a converged model costs no write;
- a foreign finalizer: odh-model-controller's registry controller puts `modelregistry.opendatahub.io/finalizer` on
  every InferenceService with registry ids and holds a retired version's InferenceService Terminating until it has
  written its record. The promotion goes on, the model stays Ready, the operator asks for the deletion once and
  makes no request while it waits, and the object goes when the finalizer does.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter_operator.api.names import REGISTRY_ISVC_FINALIZER
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kubekit import raw_call
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"
V1, V2 = "credit-limit--1-0-0", "credit-limit--1-1-0"
MODE = "serving.kserve.io/deploymentMode"


def _dm(api: client.ApiClient, ns: str) -> dict[str, Any]:
    return get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM) or {}


def _ready_on(api: client.ApiClient, ns: str, version: str) -> dict[str, Any] | None:
    dm = _dm(api, ns)
    ready = condition(dm, "Ready") or {}
    status = dm.get("status") or {}
    if ready.get("status") == "True" and status.get("observedGeneration") == dm["metadata"]["generation"] \
            and status.get("activeVersion") == version:
        return dm
    return None


def _isvc(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    return get(api, "serving.kserve.io/v1beta1", "inferenceservices", ns, name)


def _two_versions() -> dict[str, Any]:
    body = example()
    v2 = {**body["spec"]["versions"][0], "name": "1.1.0", "storageUri": "s3://models/credit-limit/1.1.0"}
    body["spec"]["versions"].append(v2)
    body["spec"]["promote"]["rollbackWindowSeconds"] = 0  # the previous version retires as soon as 1.1.0 serves
    return body


def _finalizers(api: client.ApiClient, ns: str, name: str, *, add: bool) -> None:
    """Add or remove the registry controller's finalizer alone (KServe keeps one of its own there too)."""
    isvc = _isvc(api, ns, name) or {}
    held = isvc["metadata"].get("finalizers") or []
    if add:
        ops = [{"op": "add", "path": "/metadata/finalizers/-", "value": REGISTRY_ISVC_FINALIZER}] if held else \
            [{"op": "add", "path": "/metadata/finalizers", "value": [REGISTRY_ISVC_FINALIZER]}]
    else:
        i = held.index(REGISTRY_ISVC_FINALIZER)
        ops = [{"op": "test", "path": f"/metadata/finalizers/{i}", "value": REGISTRY_ISVC_FINALIZER},
               {"op": "remove", "path": f"/metadata/finalizers/{i}"}]
    raw_call(api, "PATCH", f"/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices/{name}", body=ops,
             content_type="application/json-patch+json")


def _writes_of(op: Any, kind: str, ref: str) -> list[str]:
    return [w for w in op.writes() if f" {kind} {ref}" in w]


def test_kserves_mode_name_is_learnt_and_a_foreign_finalizer_holds_only_the_retired_version(
        control_plane, namespace, api, operator_process, predictors):
    objs = client.CustomObjectsApi(api)
    op = operator_process(namespaces=[namespace])
    create_dm(api, namespace, _two_versions())
    eventually(lambda: _ready_on(api, namespace, "1.0.0"), 90, "Ready on 1.0.0")

    # KServe 0.17's defaulting webhook rewrote the first write's RawDeployment; the operator now renders its answer.
    first = _isvc(api, namespace, V1)
    assert first is not None and first["metadata"]["annotations"][MODE] == "Standard"
    assert (first.get("status") or {}).get("deploymentMode") == "Standard"  # a plain Deployment, as KServe says

    # odh-model-controller adds its finalizer (a full Update in its code; a patch here), as it does for every
    # InferenceService that carries registry ids.
    _finalizers(api, namespace, V1, add=True)

    objs.patch_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM,
                                        {"spec": {"promote": {"version": "1.1.0"}}})
    dm = eventually(lambda: _ready_on(api, namespace, "1.1.0"), 120, "Ready on 1.1.0")
    second = _isvc(api, namespace, V2)
    assert second is not None and second["metadata"]["annotations"][MODE] == "Standard"
    # Created under KServe's name at once: one apply, no rewrite of the mode afterwards.
    assert len(_writes_of(op, "InferenceService", f"{namespace}/{V2}")) == 1, op.writes()

    # The retired version's InferenceService is Terminating, held by the foreign finalizer; the model is not.
    held = eventually(lambda: (i := _isvc(api, namespace, V1)) and i["metadata"].get("deletionTimestamp") and i,
                      60, "1.0.0's InferenceService Terminating")
    assert REGISTRY_ISVC_FINALIZER in held["metadata"]["finalizers"]
    assert [v["name"] for v in dm["status"]["versions"] if v.get("phase") == "Ready"] == ["1.1.0"]
    assert condition(dm, "Stalled") is None or condition(dm, "Stalled")["status"] == "False"

    # While it waits the operator asks for nothing: one delete of the retired version, and a nudge (a DecisionModel
    # annotation, which queues a pass) writes nothing to it.
    deletes = [w for w in _writes_of(op, "InferenceService", f"{namespace}/{V1}") if "kube-write delete" in w]
    assert len(deletes) == 1, op.writes()
    objs.patch_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM,
                                        {"metadata": {"annotations": {"example.com/nudge": "1"}}})
    time.sleep(3)
    assert [w for w in _writes_of(op, "InferenceService", f"{namespace}/{V1}") if "delete" in w] == deletes
    assert _ready_on(api, namespace, "1.1.0")

    # The registry controller lets go (its record written): the object goes, the model is untouched.
    _finalizers(api, namespace, V1, add=False)

    def gone() -> bool:
        try:
            objs.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", V1)
        except ApiException as exc:
            return exc.status == 404
        return False

    eventually(gone, 60, "1.0.0's InferenceService gone")
    assert _ready_on(api, namespace, "1.1.0")
