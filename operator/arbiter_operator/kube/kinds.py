"""Every Kubernetes kind the operator touches, declared once: where its REST path is (api version, plural, scope) and
how the operator's machinery treats it (watched into the cache and on which label, whether its watch events are
mostly echoes of the operator's own writes, whether only its status is read).

Everything else is derived from this table: the REST mapper (`kind_of`), the watches and the watch cache's kinds
(`WATCHED`), the kinds whose echoes are skimmed (`ECHOING`), the kinds decoded without their spec (`STATUS_ONLY`).
A kind missing here fails loudly (`kind_of` raises) instead of being silently unwatched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.names import (
    API_VERSION,
    APPS_API,
    ARGOCD_API,
    COORDINATION_API,
    CORE_API,
    ISVC_API,
    ISVC_LABEL,
    KIND,
    LABEL_DM,
    MODEL_REGISTRY_API,
    NETWORKING_API,
    PLURAL,
    PODMONITOR_API,
    PODMONITOR_KIND,
    PROMETHEUSRULE_KIND,
    RBAC_API,
    ROUTE_API,
    SERVINGRUNTIME_API,
)


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    # Listed and watched into the watch cache (no pass runs before every watched kind's first list is held).
    watched: bool = False
    # The label every watched object carries (the watch's server-side labelSelector); None: watched unfiltered, so a
    # cache miss is an answer (the object does not exist).
    label: str | None = None
    # Its watch events are mostly echoes of the operator's own writes (its status patches, its applies of children
    # nobody else writes): each event's name and resourceVersion are read first, and one the cache holds as it is
    # goes no further. Not InferenceServices (KServe writes their status; the view of each event is noted), nor
    # KServe's Deployments and pods (the operator never writes them).
    echoing: bool = False
    # The reconcile reads its metadata and status only: the spec is neither decoded from a watch nor held.
    status_only: bool = False

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.api_version == CORE_API else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


TABLE: tuple[Kind, ...] = (
    Kind(API_VERSION, KIND, PLURAL, watched=True, echoing=True),
    # The children the operator applies: all bear its label.
    Kind(ISVC_API, "InferenceService", "inferenceservices", watched=True, label=LABEL_DM),
    Kind(SERVINGRUNTIME_API, "ServingRuntime", "servingruntimes", watched=True, label=LABEL_DM, echoing=True),
    Kind(ROUTE_API, "Route", "routes", watched=True, label=LABEL_DM, echoing=True),
    Kind(CORE_API, "ConfigMap", "configmaps", watched=True, label=LABEL_DM, echoing=True),
    Kind(CORE_API, "Service", "services", watched=True, label=LABEL_DM, echoing=True),
    Kind(PODMONITOR_API, PODMONITOR_KIND, "podmonitors", watched=True, label=LABEL_DM, echoing=True),
    Kind(PODMONITOR_API, PROMETHEUSRULE_KIND, "prometheusrules", watched=True, label=LABEL_DM, echoing=True),
    # KServe's predictors (a version's readiness) and their pods (why a version is not ready: unschedulable, crash
    # loop), by KServe's label; only their status is read.
    Kind(APPS_API, "Deployment", "deployments", watched=True, label=ISVC_LABEL, status_only=True),
    Kind(CORE_API, "Pod", "pods", watched=True, label=ISVC_LABEL, status_only=True),
    # The grants: spec.access's callers, and the shadow phase's (the stable version's pods may call the candidate).
    Kind(RBAC_API, "Role", "roles", watched=True, label=LABEL_DM, echoing=True),
    Kind(RBAC_API, "RoleBinding", "rolebindings", watched=True, label=LABEL_DM, echoing=True),
    # spec.access.network: who may connect to the predictor pods.
    Kind(NETWORKING_API, "NetworkPolicy", "networkpolicies", watched=True, label=LABEL_DM, echoing=True),
    # Read or written, not watched:
    Kind(CORE_API, "Secret", "secrets"),
    Kind(CORE_API, "Event", "events"),
    Kind(CORE_API, "Namespace", "namespaces", namespaced=False),
    Kind(MODEL_REGISTRY_API, "ModelRegistry", "modelregistries"),
    # Read when a promotion starts on a DecisionModel Argo CD tracks: the Git revision it synced.
    Kind(ARGOCD_API, "Application", "applications"),
    # The leader election's (kube/leader.py).
    Kind(COORDINATION_API, "Lease", "leases"),
)

# The REST mapper: (apiVersion, kind) -> where it lives.
KINDS: dict[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in TABLE}
# The kinds listed and watched into the watch cache, DecisionModels first.
WATCHED: tuple[Kind, ...] = tuple(k for k in TABLE if k.watched)
# (apiVersion, kind) -> the label every held object carries, or None: what the watch cache is built with.
CACHED: dict[tuple[str, str], str | None] = {(k.api_version, k.kind): k.label for k in WATCHED}
ECHOING: frozenset[str] = frozenset(k.kind for k in TABLE if k.echoing)
STATUS_ONLY: frozenset[str] = frozenset(k.kind for k in TABLE if k.status_only)


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"unknown kind {api_version}/{kind}: add it to kube/kinds.py TABLE") from None
