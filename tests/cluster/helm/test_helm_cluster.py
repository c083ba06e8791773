"""The chart's rendered manifests on the real kube-apiserver: server-side applied and accepted, under every values set,
with the Prometheus Operator's real ServiceMonitor CRD installed (from its Go module, like the other upstream CRDs)."""

from __future__ import annotations

import copy
import uuid

import pytest
from arbiter_devenv import crds
from kubernetes import client
from support.chartkit import VALUES_SETS, apply_order, one, render
from support.kubekit import delete_quietly, dynamic_client, server_side_apply

pytestmark = pytest.mark.cluster

# The Prometheus Operator's ServiceMonitor CRD, from its Go module (like the other upstream CRDs, never committed).
SERVICEMONITOR = crds.GoModuleFiles(
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    ("example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",),
)


@pytest.fixture(scope="module")
def servicemonitor_crd(control_plane) -> None:
    api = control_plane.api_client()
    try:
        crds.install_crds(api, SERVICEMONITOR.paths(), replace=False)
    finally:
        api.close()


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}


def _create_namespace(api: client.ApiClient, name: str) -> None:
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_rendered_manifests_are_accepted_by_the_apiserver(control_plane, namespace, servicemonitor_crd, name):
    api = control_plane.api_client()
    dyn = dynamic_client(api)
    values = copy.deepcopy(VALUES_SETS[name])
    created_namespaces = []
    if values.get("watchedNamespaces"):
        suffix = uuid.uuid4().hex[:6]
        values["watchedNamespaces"] = [f"{ns}-{suffix}" for ns in values["watchedNamespaces"]]
        for ns in values["watchedNamespaces"]:
            _create_namespace(api, ns)
            created_namespaces.append(ns)
    # Release named after the namespace: cluster-scoped names (ClusterRole, binding) stay unique per test.
    docs = apply_order(render(values, namespace=namespace, release=namespace, include_crds=True))
    applied = []
    try:
        for doc in docs:
            doc.setdefault("metadata", {})
            if doc["kind"] not in CLUSTER_SCOPED | {"CustomResourceDefinition"}:
                doc["metadata"].setdefault("namespace", namespace)
            live = server_side_apply(dyn, doc)
            applied.append(doc)
            assert live["metadata"]["name"] == doc["metadata"]["name"]
            if doc["kind"] in {"ClusterRole", "Role"}:
                # RBAC is stored as written: nothing the apiserver normalised away, nothing dropped.
                assert live["rules"] == [{k: v for k, v in r.items()} for r in doc["rules"]]
        dep = one(docs, "Deployment")
        live = client.AppsV1Api(api).read_namespaced_deployment(dep["metadata"]["name"], namespace)
        # Two replicas that elect a leader, rolled one pod at a time.
        assert live.spec.replicas == 2 and live.spec.strategy.type == "RollingUpdate"
        assert live.spec.strategy.rolling_update.max_unavailable == 0
        sc = live.spec.template.spec.containers[0].security_context
        assert sc.read_only_root_filesystem and sc.allow_privilege_escalation is False
        assert sc.capabilities.drop == ["ALL"] and sc.run_as_user is None
    finally:
        for doc in reversed(applied):
            # Cluster-wide, so removed: a webhook configuration or admission policy left behind would judge every
            # later test's DecisionModel writes (a webhook through an operator Service that nothing here serves).
            if doc["kind"] in CLUSTER_SCOPED:
                delete_quietly(dyn, doc)
        for ns in created_namespaces:
            client.CoreV1Api(api).delete_namespace(ns)

