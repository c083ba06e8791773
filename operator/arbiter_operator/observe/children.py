"""Read what exists for one DecisionModel in the cluster: its children (by owner uid), their predictor Deployments
and pods, its namespace's labels, and whether the PodMonitor API is served. Reads only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..api.models import DEFAULT_METRICS_READER_SECRET, DEFAULT_RUNTIME_IMAGE, DecisionModel
from ..api.names import (
    APPS_API,
    CORE_API,
    ISVC_API,
    ISVC_LABEL,
    LABEL_COMPONENT,
    LABEL_DM,
    NETWORKING_API,
    PODMONITOR_API,
    PODMONITOR_KIND,
    PROMETHEUSRULE_KIND,
    RBAC_API,
    ROUTE_API,
    SERVINGRUNTIME_API,
)
from ..kube.client import KubeClient, KubeError
from ..plan.model import Observations
from ..render.common import runtime_name
from ..render.networkpolicy import networkpolicy_name
from ..render.podmonitor import podmonitor_name
from ..render.prometheusrule import prometheusrule_name
from ..render.service import stable_service_name

log = logging.getLogger("arbiter.observe")


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Its controller ownerReference is this very DecisionModel (by uid: not a deleted one of the same name still
    being collected, not a team's object that merely carries our label)."""
    ref = controller_of(obj)
    return bool(uid) and ref is not None and ref.get("uid") == uid


def _owned(obj: dict[str, Any], dm: DecisionModel) -> bool:
    return owned_by(obj, dm.metadata.uid)


@dataclass(frozen=True)
class ByLabel:
    """Listed by the operator's label (and the component label, when set): children of which there are several."""

    component: str | None = None


@dataclass(frozen=True)
class ByName:
    """Read by name (the DecisionModel's name -> the child's): children of which there is one."""

    name: Callable[[str], str]


@dataclass(frozen=True)
class Scope:
    """What decides whether a kind is read at all in one reconcile."""

    dm: DecisionModel
    podmonitor_api: bool
    prometheusrule_api: bool = False


def _always(_: Scope) -> bool:
    return True


@dataclass(frozen=True)
class ChildKind:
    api_version: str
    kind: str
    find: ByLabel | ByName
    when: Callable[[Scope], bool] = _always


# Every kind of child the operator renders, in the order they are read: a reconcile observes each (owned, by uid)
# into Observations.children, and apply_plan checks what it finds before writing (ownership, drift).
CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind(ISVC_API, "InferenceService", ByLabel()),
    ChildKind(CORE_API, "ConfigMap", ByLabel("decision-config")),
    # The grants (spec.access's callers, the shadow phase's), from the watch cache.
    ChildKind(RBAC_API, "Role", ByLabel()),
    ChildKind(RBAC_API, "RoleBinding", ByLabel()),
    ChildKind(SERVINGRUNTIME_API, "ServingRuntime", ByName(runtime_name)),
    ChildKind(ROUTE_API, "Route", ByName(lambda dm_name: dm_name)),
    ChildKind(PODMONITOR_API, PODMONITOR_KIND, ByName(podmonitor_name), when=lambda scope: scope.podmonitor_api),
    ChildKind(PODMONITOR_API, PROMETHEUSRULE_KIND, ByName(prometheusrule_name),
              when=lambda scope: scope.prometheusrule_api),
    ChildKind(CORE_API, "Service", ByName(stable_service_name)),
    ChildKind(NETWORKING_API, "NetworkPolicy", ByName(networkpolicy_name)),
)


async def _observe_kind(client: KubeClient, dm: DecisionModel, child: ChildKind) -> list[dict[str, Any]]:
    """The owned children of one kind."""
    ns, name = dm.metadata.namespace, dm.metadata.name
    if isinstance(child.find, ByLabel):
        selector = f"{LABEL_DM}={name}"
        if child.find.component:
            selector += f",{LABEL_COMPONENT}={child.find.component}"
        return [o for o in await client.alist(child.api_version, child.kind, ns, selector) if _owned(o, dm)]
    # From the watch cache where there is one (`aheld`: a child of ours carries our label, so the cache holds every
    # one; a miss is an absent child, whose name apply_plan checks on the apiserver before creating).
    obj = await client.aheld(child.api_version, child.kind, ns, child.find.name(name))
    return [obj] if obj is not None and _owned(obj, dm) else []


async def observe_children(client: KubeClient, dm: DecisionModel, podmonitor_api: bool = False,
                           default_runtime_image: str = DEFAULT_RUNTIME_IMAGE,
                           prometheusrule_api: bool = False,
                           metrics_reader_secret: str = DEFAULT_METRICS_READER_SECRET) -> Observations:
    """podmonitor_api, prometheusrule_api: whether those APIs are served (`podmonitor_served`,
    `prometheusrule_served`; observed once per process).
    default_runtime_image: the operator's setting for versions that name no image.
    metrics_reader_secret: the operator's setting for the Secret a PodMonitor presents to runtimes with auth on.
    Awaited on the operator's loop: from the watch cache, what it holds (no request, no thread), the rest from the
    apiserver."""
    ns = dm.metadata.namespace
    scope = Scope(dm, podmonitor_api, prometheusrule_api)
    children = {(child.kind, o["metadata"]["name"]): o
                for child in CHILD_KINDS if child.when(scope)
                for o in await _observe_kind(client, dm, child)}
    try:
        namespace = await client.aget(CORE_API, "Namespace", None, ns) or {}
        ns_labels = (namespace.get("metadata") or {}).get("labels") or {}
    except KubeError as exc:
        # Without permission to read namespaces, `mesh.sidecar: auto` cannot see the injection label: say so.
        log.warning("cannot read namespace %s labels (%s); mesh auto mode assumes no injection", ns, exc.reason)
        ns_labels = {}
    isvcs = {name: o for (kind, name), o in children.items() if kind == "InferenceService"}
    deployments, pods, workloads = await _observe_workloads(client, ns, isvcs)
    # KServe's predictor Services bear the InferenceService's labels (ours among them): the watch cache holds them.
    services = {f"{n}-predictor": s for n in sorted(isvcs)
                if (s := await client.aheld(CORE_API, "Service", ns, f"{n}-predictor")) is not None}
    return Observations(
        workloads_observed=workloads,
        predictor_deployments=deployments,
        predictor_pods=pods,
        predictor_services=services,
        namespace_labels=ns_labels,
        children=children,
        podmonitor_api=podmonitor_api,
        prometheusrule_api=prometheusrule_api,
        default_runtime_image=default_runtime_image,
        metrics_reader_secret=metrics_reader_secret,
    )


def _isvc_ready(isvc: dict[str, Any]) -> bool:
    conds = (isvc.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


async def _observe_workloads(
    client: KubeClient, ns: str, isvcs: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[dict[str, Any], ...]], bool]:
    """The predictor Deployments of these InferenceServices and, for those not ready, their pods. (deployments,
    pods, observed): observed False when the operator may not read them (readiness then rests on KServe alone)."""
    if not isvcs:
        return {}, {}, True
    selector = f"{ISVC_LABEL} in ({','.join(sorted(isvcs))})"
    try:
        deployments: dict[str, dict[str, Any]] = {}
        for d in await client.alist(APPS_API, "Deployment", ns, selector):
            owner = ((d.get("metadata") or {}).get("labels") or {}).get(ISVC_LABEL)
            if owner and d["metadata"]["name"] == f"{owner}-predictor" and _belongs_to(d, isvcs.get(owner)):
                deployments[owner] = d
        waiting = sorted(n for n, i in isvcs.items() if not _isvc_ready(i) or n not in deployments)
        pods: dict[str, list[dict[str, Any]]] = {}
        if waiting:  # pods are read only while a version is not ready: a converged reconcile lists Deployments only
            for p in await client.alist(CORE_API, "Pod", ns, f"{ISVC_LABEL} in ({','.join(waiting)})"):
                owner = ((p.get("metadata") or {}).get("labels") or {}).get(ISVC_LABEL)
                if owner:
                    pods.setdefault(owner, []).append(p)
    except KubeError as exc:
        if exc.status != 403:
            raise
        log.warning("cannot read predictor Deployments/pods in %s (%s); readiness rests on KServe's status alone",
                    ns, exc.reason)
        return {}, {}, False
    return deployments, {k: tuple(v) for k, v in pods.items()}, True


def _belongs_to(deployment: dict[str, Any], isvc: dict[str, Any] | None) -> bool:
    """Whether KServe made this Deployment for this very InferenceService. A version stopped and started again (a
    retry) gets a new InferenceService under the same name while the garbage collector may still hold the old
    Deployment, available from before: counting it would call the new version ready before it has loaded."""
    uid = ((isvc or {}).get("metadata") or {}).get("uid")
    if not uid:
        return True  # nothing to compare with (an object built in memory): the name and label decide
    refs = (deployment.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


async def podmonitor_served(client: KubeClient) -> bool | None:
    """Whether the cluster serves PodMonitors (prometheus-operator installed). None: cannot tell now (ask later)."""
    return await _served(client, PODMONITOR_KIND)


async def prometheusrule_served(client: KubeClient) -> bool | None:
    """Whether the cluster serves PrometheusRules. None: cannot tell now (ask later)."""
    return await _served(client, PROMETHEUSRULE_KIND)


async def _served(client: KubeClient, kind: str) -> bool | None:
    try:
        return await client.aserved(PODMONITOR_API, kind)
    except KubeError as exc:
        log.warning("cannot tell whether the %s API is served (%s %s); asking again next reconcile",
                    kind, exc.status, exc.reason)
        return None
