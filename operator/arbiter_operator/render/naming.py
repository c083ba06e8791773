"""Every object name derived from one DecisionModel, by kind: what the operator creates and what KServe creates from
it. Pure. docs/architecture.md ("Child names") proves that two DecisionModels in one namespace never share one;
tests/unit/operator/test_naming.py checks it with generated pairs.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..api.models import isvc_name
from .access_rbac import callers_name
from .common import configmap_name, predictor_service, runtime_name
from .networkpolicy import networkpolicy_name
from .podmonitor import podmonitor_name
from .prometheusrule import prometheusrule_name
from .shadow_rbac import shadow_rbac_name

Named = tuple[str, str]  # (kind, name)


def derived_names(dm_name: str, versions: Iterable[str], nodes: int = 1) -> set[Named]:
    """(kind, name) of every namespaced object that exists because of this DecisionModel."""
    out: set[Named] = {
        ("ServingRuntime", runtime_name(dm_name)),
        ("Route", dm_name),
        ("PodMonitor", podmonitor_name(dm_name)),
        ("PrometheusRule", prometheusrule_name(dm_name)),
        ("Role", callers_name(dm_name)),
        ("RoleBinding", callers_name(dm_name)),
        ("Role", shadow_rbac_name(dm_name)),
        ("RoleBinding", shadow_rbac_name(dm_name)),
        ("NetworkPolicy", networkpolicy_name(dm_name)),
    }
    for v in versions:
        isvc = isvc_name(dm_name, v)
        out |= {
            ("InferenceService", isvc),
            ("ConfigMap", configmap_name(dm_name, v)),
            ("Service", predictor_service(dm_name, v)),  # KServe: predictor Deployment and Service
            ("Deployment", predictor_service(dm_name, v)),
        }
        if nodes > 1:
            out |= {("Service", f"{isvc}-predictor-worker"), ("Deployment", f"{isvc}-predictor-worker")}
    return out


def derived_labels(dm_name: str, versions: Iterable[str], nodes: int = 1) -> set[str]:
    """Label values derived from the names (each must be at most 63 characters)."""
    out = {dm_name}
    for v in versions:
        out |= {v, f"isvc.{isvc_name(dm_name, v)}-predictor"}
        if nodes > 1:
            out.add(f"isvc.{isvc_name(dm_name, v)}-predictor-worker")
    return out
