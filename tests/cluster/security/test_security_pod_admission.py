"""The operator pod and the runtime pods pass OpenShift's restricted-v2 rules, and the real apiserver's Pod Security
admission admits them in a namespace that enforces `restricted` (and refuses a pod that breaks it, so the namespace
really enforces)."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from support.chartkit import VALUES_SETS, one, render, restricted_violations, writable_mounts
from support.kubekit import api_error
from support.podkit import as_pod, example_decision_model, runtime_pods

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
MESH_INJECTED = {"istio-injection": "enabled"}


def _runtime_cases():
    return {
        "one-gpu": example_decision_model(),
        "tensor-parallel-4": example_decision_model(serving={"gpus": 4}),
        "multi-node": example_decision_model(serving={"gpus": 8, "nodes": 2}),
    }


# ------------------------------------------------------------------ pure checks (no cluster)


@pytest.mark.parametrize("case", ["one-gpu", "tensor-parallel-4", "multi-node"])
def test_runtime_pods_follow_restricted_v2(case: str) -> None:
    for role, spec in runtime_pods(_runtime_cases()[case], MESH_INJECTED).items():
        assert restricted_violations(spec) == [], f"{case}/{role}"
        for container in spec["containers"]:
            # Read-only root: every path the runtime writes is an emptyDir.
            for path in writable_mounts(container):
                vol = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == path)
                assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == vol), (case, role, path)


# ------------------------------------------------------------------ the real apiserver


def _restricted_namespace(api: client.ApiClient, namespace: str) -> None:
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})


def _create_pod(api: client.ApiClient, pod: dict) -> None:
    client.CoreV1Api(api).create_namespaced_pod(pod["metadata"]["namespace"], pod)


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_restricted_namespace_admits_the_operator_pod(control_plane, namespace, name) -> None:
    api = control_plane.api_client()
    _restricted_namespace(api, namespace)
    docs = render(VALUES_SETS[name], namespace=namespace)
    template = one(docs, "Deployment")["spec"]["template"]
    pod = as_pod(template["spec"], "operator", namespace, template["metadata"].get("labels"))
    _create_pod(api, pod)
    live = client.CoreV1Api(api).read_namespaced_pod("operator", namespace)
    assert live.spec.containers[0].security_context.read_only_root_filesystem is True


@pytest.mark.cluster
def test_restricted_namespace_refuses_a_pod_that_escalates(control_plane, namespace) -> None:
    # The control that makes the admissions above mean something: the same pod, one rule broken, is refused.
    api = control_plane.api_client()
    _restricted_namespace(api, namespace)
    template = one(render(namespace=namespace), "Deployment")["spec"]["template"]
    spec = copy.deepcopy(template["spec"])
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiException) as err:
        _create_pod(api, as_pod(spec, "escalating", namespace))
    assert err.value.status == 403
    assert "violates PodSecurity" in api_error(err.value) and "allowPrivilegeEscalation" in api_error(err.value)


@pytest.mark.cluster
@pytest.mark.parametrize("case", ["one-gpu", "tensor-parallel-4", "multi-node"])
def test_restricted_namespace_admits_the_runtime_pods(control_plane, namespace, case) -> None:
    api = control_plane.api_client()
    _restricted_namespace(api, namespace)
    for role, spec in runtime_pods(_runtime_cases()[case], MESH_INJECTED).items():
        _create_pod(api, as_pod(spec, f"{case}-{role}", namespace))
