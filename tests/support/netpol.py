"""What a NetworkPolicy admits, read as the Kubernetes API defines it (networking.k8s.io/v1), for the tests: no
network plugin enforces traffic on the local cluster (kwok's pods have no network at all), so the tests judge the
policy the apiserver stores against the labels of the pods and namespaces the apiserver holds.

Semantics (NetworkPolicySpec): a pod is isolated for ingress when some policy of its namespace selects it
(`podSelector`) with `Ingress` in `policyTypes`; then a connection is admitted when some such policy has an ingress
rule whose `ports` hold the port (none: every port; a name: the container port of that name) and whose `from` holds a
peer that matches the source (none: every source). A peer with `namespaceSelector` and `podSelector` matches pods
with those labels in namespaces with those labels; `namespaceSelector` alone, every pod there; `podSelector` alone,
those pods in the policy's own namespace. `ipBlock` is not judged (no policy here uses it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels ({} or None selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)  # container port name -> number


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns_sel is None and source.namespace != policy_ns:
        return False
    if ns_sel is not None and not selects(ns_sel, source.namespace_labels):
        return False
    return pod_sel is None or selects(pod_sel, source.labels)


def _port_matches(rule_port: Mapping[str, Any], port: int, protocol: str, target: Pod) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    want = rule_port.get("port")
    if want is None:
        return True
    number = target.ports.get(want) if isinstance(want, str) else want
    end = rule_port.get("endPort", number)
    return number is not None and number <= port <= (end or number)


def isolated(policies: Iterable[Mapping[str, Any]], target: Pod) -> bool:
    return any(_applies(p, target) for p in policies)


def _applies(policy: Mapping[str, Any], target: Pod) -> bool:
    spec = policy["spec"]
    types = spec.get("policyTypes") or ["Ingress"]
    return (policy["metadata"]["namespace"] == target.namespace and "Ingress" in types
            and selects(spec.get("podSelector"), target.labels))


def admits(policies: Iterable[Mapping[str, Any]], source: Pod, target: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from `source` to `target`'s `port` is admitted by the policies of target's namespace."""
    selecting = [p for p in policies if _applies(p, target)]
    if not selecting:
        return True  # not isolated: everything is admitted
    for policy in selecting:
        ns = policy["metadata"]["namespace"]
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(_port_matches(rp, port, protocol, target) for rp in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(peer, ns, source) for peer in peers):
                return True
    return False
