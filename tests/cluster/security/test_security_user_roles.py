"""Project members get DecisionModels through the cluster's default roles: the chart's ClusterRoles are aggregated
into `admin`/`edit`/`view` by the real kube-controller-manager's clusterrole-aggregation controller, and the real RBAC
authorizer then lets an `edit` user create a DecisionModel and refuses a `view` user, who can still read it."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv import _procs
from arbiter_devenv.tools import ensure_tool
from kubernetes import client
from support.chartkit import render
from support.kubekit import dynamic_client, server_side_apply
from support.operator_kit import eventually, example

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"


@pytest.fixture
def aggregation(control_plane: Any, tmp_path: pathlib.Path) -> Iterator[None]:
    """kube-controller-manager running only the clusterrole-aggregation controller."""
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    proc = _procs.spawn([
        str(ensure_tool("kube-controller-manager")), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
        "--controllers=clusterrole-aggregation", "--profiling=false",
    ], log_path=tmp_path / "kcm.log")
    try:
        yield
    finally:
        _procs.terminate(proc)


def _user_token(core: client.CoreV1Api, ns: str, name: str) -> str:
    core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    return core.create_namespaced_service_account_token(
        name, ns, client.AuthenticationV1TokenRequest(spec=spec)).status.token


def _as(control_plane: Any, tmp_path: pathlib.Path, token: str) -> client.ApiClient:
    from kubernetes import config

    path = control_plane.write_kubeconfig(tmp_path / f"user-{uuid.uuid4().hex[:6]}.kubeconfig", token=token)
    return config.new_client_from_config(str(path))


def test_edit_can_apply_a_decisionmodel_view_can_only_read(control_plane, namespace, aggregation, tmp_path):
    admin = control_plane.api_client()
    try:
        dyn = dynamic_client(admin)
        for doc in render({}, namespace="arbiter-system"):
            if doc["kind"] == "ClusterRole" and any(
                    k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in doc["metadata"]["labels"]):
                server_side_apply(dyn, doc)
        rbac, core = client.RbacAuthorizationV1Api(admin), client.CoreV1Api(admin)

        def aggregated() -> bool:
            edit = rbac.read_cluster_role("edit").rules or []
            view = rbac.read_cluster_role("view").rules or []
            return any("decisionmodels" in (r.resources or []) and "create" in r.verbs for r in edit) and \
                any("decisionmodels" in (r.resources or []) for r in view)

        eventually(aggregated, 60, "DecisionModel rules aggregated into edit and view")
        tokens = {}
        for role in ("edit", "view"):
            tokens[role] = _user_token(core, namespace, f"{role}-user")
            rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=f"{role}-user"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name=f"{role}-user", namespace=namespace)]))
        body = example()
        editor, viewer = _as(control_plane, tmp_path, tokens["edit"]), _as(control_plane, tmp_path, tokens["view"])
        try:
            as_viewer = client.CustomObjectsApi(viewer)
            with pytest.raises(client.ApiException) as refused:
                as_viewer.create_namespaced_custom_object(G, V, namespace, P, body)
            assert refused.value.status == 403
            created = client.CustomObjectsApi(editor).create_namespaced_custom_object(G, V, namespace, P, body)
            assert created["metadata"]["name"] == body["metadata"]["name"]
            listed = as_viewer.list_namespaced_custom_object(G, V, namespace, P)["items"]
            assert [d["metadata"]["name"] for d in listed] == [body["metadata"]["name"]]
            with pytest.raises(client.ApiException) as no_delete:
                as_viewer.delete_namespaced_custom_object(G, V, namespace, P, body["metadata"]["name"])
            assert no_delete.value.status == 403
            client.CustomObjectsApi(editor).delete_namespaced_custom_object(G, V, namespace, P,
                                                                           body["metadata"]["name"])
        finally:
            editor.close()
            viewer.close()
    finally:
        admin.close()
