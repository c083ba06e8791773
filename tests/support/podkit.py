"""The pods Arbiter puts on a cluster, as the cluster would see them.

The operator pod comes from the chart's Deployment. The runtime pods come from the operator's own builders
(arbiter_operator.render): `predictor_pods` merges the ServingRuntime's container with the InferenceService's
predictor the way KServe's Standard (RawDeployment) reconciler does, so every rendering variant can be checked against
Pod Security admission without deploying it (the pods the real KServe controller makes are checked in
tests/cluster/operator/test_operator_kserve.py) (the predictor's
`model` container fields override the runtime container's; pod-level fields come from the predictor; the model
volume KServe's storage initializer fills is mounted read-only at /mnt/models).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from support.examples import example

# Pod-level fields of a KServe predictor (ComponentExtensionSpec fields and `model` are not pod fields).
_POD_FIELDS = {
    "securityContext",
    "volumes",
    "tolerations",
    "nodeSelector",
    "affinity",
    "serviceAccountName",
    "imagePullSecrets",
    "priorityClassName",
    "runtimeClassName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "initContainers",
    "automountServiceAccountToken",
    "schedulerName",
}
_MODEL_ONLY_FIELDS = {"modelFormat", "runtime", "storageUri", "storage", "protocolVersion"}


def example_decision_model(**spec_overrides: Any) -> Any:
    from arbiter_operator.api.models import DecisionModel

    doc = example()
    doc["metadata"].setdefault("namespace", "models")
    doc["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000001")
    for key, value in spec_overrides.items():
        doc["spec"][key] = value
    return DecisionModel.model_validate(doc)


def _merge_container(runtime_c: Mapping[str, Any], override: Mapping[str, Any], name: str) -> dict[str, Any]:
    merged = copy.deepcopy(dict(runtime_c))
    for key, value in override.items():
        if key in _MODEL_ONLY_FIELDS:
            continue
        if key == "args":
            merged["args"] = list(merged.get("args") or []) + list(value)
        elif key == "env":
            merged["env"] = list(merged.get("env") or []) + list(value)
        else:
            merged[key] = copy.deepcopy(value)
    merged["name"] = name
    return merged


def predictor_pods(isvc: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod specs for the head predictor and, for multi-node serving, the worker: {"head": spec, "worker": spec}."""
    predictor = isvc["spec"]["predictor"]
    pod: dict[str, Any] = {k: copy.deepcopy(v) for k, v in predictor.items() if k in _POD_FIELDS}
    head = _merge_container(runtime["spec"]["containers"][0], predictor.get("model") or {}, "kserve-container")
    if predictor["model"].get("storageUri"):
        pod.setdefault("volumes", []).append({"name": "kserve-provision-location", "emptyDir": {}})
        head.setdefault("volumeMounts", []).append(
            {"name": "kserve-provision-location", "mountPath": "/mnt/models", "readOnly": True}
        )
    pod["containers"] = [head]
    pods = {"head": pod}
    worker = predictor.get("workerSpec")
    if worker:
        rt_worker = ((runtime["spec"].get("workerSpec") or {}).get("containers") or [{}])[0]
        wpod: dict[str, Any] = {k: copy.deepcopy(v) for k, v in predictor.items() if k in _POD_FIELDS - {"volumes"}}
        wpod["volumes"] = copy.deepcopy(worker.get("volumes") or [])
        wpod["containers"] = [
            _merge_container(rt_worker, c, c.get("name", "worker-container")) for c in worker.get("containers") or []
        ]
        pods["worker"] = wpod
    return pods


def runtime_pods(dm: Any, namespace_labels: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Render the DecisionModel's first version through the operator's builders and return its pod specs."""
    from arbiter_operator.render import (
        PredictorInputs,
        render_configmap,
        render_inferenceservice,
        render_servingruntime,
    )

    version = dm.spec.versions[0]
    cm = render_configmap(dm, version)
    isvc = render_inferenceservice(PredictorInputs(dm, version, cm, namespace_labels or {}))
    runtime = render_servingruntime(dm)
    return predictor_pods(isvc, runtime)


def as_pod(spec: Mapping[str, Any], name: str, namespace: str, labels: Mapping[str, str] | None = None) -> dict:
    spec = copy.deepcopy(dict(spec))
    # The admission test creates the pod directly: the ServiceAccount must exist, and there is no scheduler.
    spec.pop("serviceAccountName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
    }
