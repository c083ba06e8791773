"""spec.access.network as a NetworkPolicy on the model's predictor pods (pure): ingress only from the peers listed and
from what must reach the pods (NetworkPolicies only add, so the pods are closed to every other source once one
selects them).

What must reach them, on OpenShift:
- the router (the Route's reencrypt to the authenticating proxy, or edge to the runtime): the namespaces OpenShift
  labels `policy-group.network.openshift.io/ingress` (its documented selector for the ingress controllers);
- the monitoring stack (the PodMonitor's scrapes of the runtime's port): the namespaces labelled
  `network.openshift.io/policy-group: monitoring` (user-workload monitoring's);
- the model's own predictor pods while they call each other: the stable version mirrors to the candidate (shadow
  phase), forwards a pinned context to its version (spec.routing.contexts), or a multi-node predictor's pods form
  one Ray cluster (every port, between the pods of this model only).
The kubelet's probes are not subject to NetworkPolicy. Egress is left alone: the runtime reaches the apiserver (its
reviews), vLLM in its own pod, the audit bucket.

Enforcement is the cluster network plugin's (OVN-Kubernetes on OpenShift): this object only declares it.
"""

from __future__ import annotations

from typing import Any

from ..api.governance import NetworkPeer
from ..api.models import DecisionModel
from ..api.names import NETWORKING_API
from .common import LABEL_COMPONENT, LABEL_DM, SERVING_PORT, metadata
from .route import PROXY_PORT_NAME

COMPONENT = "network-policy"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
ROUTER_NAMESPACES = {"policy-group.network.openshift.io/ingress": ""}
MONITORING_NAMESPACES = {"network.openshift.io/policy-group": "monitoring"}


def networkpolicy_name(dm_name: str) -> str:
    return f"{dm_name}-predictors"


def predictor_selector(dm: DecisionModel) -> dict[str, str]:
    """The labels every predictor pod of this DecisionModel bears (render/inferenceservice.py's pod labels)."""
    return {LABEL_DM: dm.metadata.name, LABEL_COMPONENT: "predictor"}


def _peer(peer: NetworkPeer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.namespace is not None:
        out["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: peer.namespace}}
    elif peer.namespaceLabels is not None:
        out["namespaceSelector"] = {"matchLabels": dict(sorted(peer.namespaceLabels.items()))}
    if peer.podLabels is not None:
        out["podSelector"] = {"matchLabels": dict(sorted(peer.podLabels.items()))}
    return out


def render_networkpolicy(dm: DecisionModel, peers_call_each_other: bool) -> dict[str, Any] | None:
    """The NetworkPolicy, or None without spec.access.network. peers_call_each_other: this pass has the model's pods
    calling each other (a shadow phase, pinned contexts)."""
    access = dm.spec.access
    if access is None or access.network is None:
        return None
    serving = [{"protocol": "TCP", "port": SERVING_PORT}, {"protocol": "TCP", "port": PROXY_PORT_NAME}]
    ingress: list[dict[str, Any]] = []
    listed = [_peer(p) for p in access.network.from_]
    if listed:
        ingress.append({"from": listed, "ports": serving})
    ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(ROUTER_NAMESPACES)}}], "ports": serving})
    ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(MONITORING_NAMESPACES)}}],
                    "ports": [{"protocol": "TCP", "port": SERVING_PORT}]})
    own = {"podSelector": {"matchLabels": predictor_selector(dm)}}
    if dm.spec.serving.nodes > 1:
        ingress.append({"from": [own]})  # one Ray cluster: its pods talk on ports of Ray's choosing
    elif peers_call_each_other:
        ingress.append({"from": [own], "ports": [{"protocol": "TCP", "port": SERVING_PORT}]})
    return {
        "apiVersion": NETWORKING_API,
        "kind": "NetworkPolicy",
        "metadata": metadata(dm, networkpolicy_name(dm.metadata.name), COMPONENT),
        "spec": {"podSelector": {"matchLabels": predictor_selector(dm)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
