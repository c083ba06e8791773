"""Identities on the real apiserver for the tests of who may do what (decisions, metrics), made as docs/install.md and
docs/security.md have an administrator make them: a ServiceAccount's token (a TokenRequest, the kind a pod or a token
Secret holds); the chart's metrics-reader ClusterRole (`get` on the non-resource URL /metrics, applied as `helm
template` renders it) and bindings to it; a runtime's system:auth-delegator binding; a caller's `get` on one
InferenceService (what calling a model with auth on takes)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from support.chartkit import render
from support.kubekit import dynamic_client, server_side_apply


def service_account_token(api: client.ApiClient, namespace: str, name: str, seconds: int = 3600) -> str:
    """A token of the ServiceAccount `name` (created if absent)."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=name)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    return str(core.create_namespaced_service_account_token(
        name, namespace, client.AuthenticationV1TokenRequest(spec=spec)).status.token)


def chart_metrics_reader(api: client.ApiClient, release: str = "arbiter") -> dict[str, Any]:
    """The chart's metrics-reader ClusterRole of the release `release`, applied; the rendered object (a release of
    its own keeps a shared cluster's other tests' objects apart: delete it afterwards)."""
    (role,) = [d for d in render(release=release) if d["kind"] == "ClusterRole"
               and d["metadata"]["name"].endswith("-metrics-reader")]
    server_side_apply(dynamic_client(api), role)
    return role


def bind_to_metrics_reader(api: client.ApiClient, namespace: str, account: str, role: str) -> str:
    """A ClusterRoleBinding of the metrics-reader ClusterRole `role` to the ServiceAccount; its name (the caller
    deletes it)."""
    return _bind_cluster_role(api, namespace, account, role, f"{namespace}-{account}-metrics-reader")


def _bind_cluster_role(api: client.ApiClient, namespace: str, account: str, role: str, name: str) -> str:
    client.RbacAuthorizationV1Api(api).create_cluster_role_binding(client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)]))
    return name


def bind_auth_delegator(api: client.ApiClient, namespace: str, account: str) -> str:
    """system:auth-delegator for the ServiceAccount (a runtime's own, with auth on); the binding's name."""
    return _bind_cluster_role(api, namespace, account, "system:auth-delegator", f"{namespace}-{account}-auth-delegator")


def grant_inferenceservice_get(api: client.ApiClient, namespace: str, account: str, isvc: str) -> None:
    """`get` on the InferenceService `isvc` for the ServiceAccount: a Role and RoleBinding in the namespace."""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name=f"call-{isvc}"),
        rules=[client.V1PolicyRule(api_groups=["serving.kserve.io"], resources=["inferenceservices"],
                                   resource_names=[isvc], verbs=["get"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{account}-calls-{isvc}"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=f"call-{isvc}"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)]))
