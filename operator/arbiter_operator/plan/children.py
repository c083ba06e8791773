"""The children one plan applies and the ones it deletes, from the promotion's plan and what was observed (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ..api.models import DecisionModel, ModelVersion, isvc_name
from ..api.names import CORE_API, ISVC_API, NETWORKING_API, RBAC_API
from ..promotion.machine import PromotionPlan
from ..render import (
    PredictorInputs,
    configmap_name,
    render_configmap,
    render_inferenceservice,
    render_podmonitor,
    render_prometheusrule,
    render_route,
    render_servingruntime,
    render_stable_service,
)
from ..render.access_rbac import render_access_rbac
from ..render.networkpolicy import render_networkpolicy
from ..render.shadow_rbac import render_shadow_rbac
from .model import ArtifactObservation, Observations


def runtime_image(dm: DecisionModel, isvc: dict[str, Any] | None, default: str) -> str:
    """The image a version runs: spec.serving.runtimeImage when set (the user's explicit choice, for every live
    version at once); otherwise the image its InferenceService already runs (pinned at deploy time); otherwise the
    operator's default. So a new operator default never restarts a serving version: it arrives with the next version
    that is deployed, i.e. through a promotion, canaried and analysed against the stable version on the old image."""
    if dm.spec.serving.runtimeImage:
        return dm.spec.serving.runtimeImage
    model = (((isvc or {}).get("spec") or {}).get("predictor") or {}).get("model") or {}
    pinned = model.get("image")
    return pinned if isinstance(pinned, str) and pinned else default


def unwanted(obs: Observations, wanted: Mapping[tuple[str, str], set[str]]) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of each observed child of a kind in `wanted` whose name is not wanted."""
    return [(api_version, kind, name) for (api_version, kind), names in wanted.items()
            for name in sorted(obs.of_kind(kind)) if name not in names]


class Desired(NamedTuple):
    children: list[dict[str, Any]]  # to apply
    deletions: list[tuple[str, str, str]]  # (apiVersion, kind, name) observed and no longer wanted
    live: list[str]  # the live versions in spec order
    retained: list[str]  # live versions that left spec.versions: kept as observed
    stable: str | None  # the version holding the most traffic
    route: dict[str, Any] | None  # the Route rendered (None: no ready version yet)


def desired_children(dm: DecisionModel, obs: Observations, pplan: PromotionPlan,
                     versions: Mapping[str, ModelVersion], isvc_by_version: Mapping[str, dict[str, Any]]) -> Desired:
    """The children a plan applies and deletes, from the promotion's plan and what was observed."""
    # Desired children: the runtime, one ConfigMap + InferenceService per live version, the Route.
    children: list[dict[str, Any]] = [render_servingruntime(dm, obs.default_runtime_image)]
    live = [v for v in versions if v in pplan.live]  # spec order: stable rendering
    for v in live:
        children.extend(_version_children(dm, obs, pplan, versions[v], isvc_by_version.get(v)))
    # While the stable version mirrors to the candidate, its pods may call the candidate (auth on); never otherwise.
    shadow_rbac = render_shadow_rbac(dm, pplan.shadow.candidate) if pplan.shadow and dm.spec.exposure.auth else []
    children.extend(shadow_rbac)
    if obs.podmonitor_api:
        # Prometheus scrapes the predictors (the promotion analysis needs it), with a token when auth is on.
        children.append(render_podmonitor(dm, obs.metrics_reader_secret))
    if obs.prometheusrule_api:
        children.append(render_prometheusrule(dm))  # the alerts on the model's decision servers
    stable = max(pplan.traffic, key=lambda v: (pplan.traffic[v], v)) if pplan.traffic else None
    if stable is not None and stable in versions:
        children.append(render_stable_service(dm, stable))  # follows the stable version; status.address names it
    route = render_route(dm, pplan.traffic)
    if route is not None:
        children.append(route)
    # No ready version: the Route is left as it is (it may point at a version coming back); never pointed at nothing.

    # A live version that left spec.versions (e.g. the stable one, removed while its successor is not serving yet)
    # cannot be rendered: there is no spec for it. Its InferenceService and ConfigMap are kept exactly as observed
    # (neither re-applied nor deleted) until the promotion stops needing it; then the usual deletion removes them.
    retained = sorted(v for v in pplan.live if v not in versions and v in isvc_by_version)
    # spec.access: the callers may get every InferenceService this pass keeps (live or retained), no other.
    access_rbac = render_access_rbac(dm, live + retained)
    children.extend(access_rbac)
    # spec.access.network: the predictor pods admit the listed peers and what must reach them (the model's own pods
    # while they call each other: mirroring, forwarding pinned contexts).
    routes = dm.spec.routing is not None and bool(dm.spec.routing.contexts)
    netpol = render_networkpolicy(dm, peers_call_each_other=pplan.shadow is not None or routes)
    if netpol is not None:
        children.append(netpol)
    deletions = unwanted(obs, _wanted(dm, live + retained, shadow_rbac + access_rbac + ([netpol] if netpol else [])))
    return Desired(children, deletions, live, retained, stable, route)


def _version_children(dm: DecisionModel, obs: Observations, pplan: PromotionPlan, version: ModelVersion,
                      isvc: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A live version's ConfigMap (decision.json) and its InferenceService."""
    art = obs.artifacts.get(version.name, ArtifactObservation())
    shadow = pplan.shadow if pplan.shadow is not None and pplan.shadow.stable == version.name else None
    cm = render_configmap(dm, version, diffusion=art.diffusion, shadow=shadow)
    isvc_manifest = render_inferenceservice(PredictorInputs(
        dm=dm, version=version, configmap=cm, namespace_labels=obs.namespace_labels,
        registry_ids=obs.registry_ids.get(version.name), diffusion=art.diffusion,
        runtime_image=runtime_image(dm, isvc, obs.default_runtime_image), storage_key=art.storage_key,
        deployment_mode=obs.kserve_deployment_mode,
    ))
    return [cm, isvc_manifest]


def _wanted(dm: DecisionModel, kept: list[str], sometimes: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """The children that come and go (per version, per phase, per spec field), by (apiVersion, kind): those observed
    and no longer wanted are deleted."""
    return {(ISVC_API, "InferenceService"): {isvc_name(dm.metadata.name, v) for v in kept},
            (CORE_API, "ConfigMap"): {configmap_name(dm.metadata.name, v) for v in kept},
            **{(api, kind): {c["metadata"]["name"] for c in sometimes if c["kind"] == kind}
               for api, kind in ((RBAC_API, "Role"), (RBAC_API, "RoleBinding"), (NETWORKING_API, "NetworkPolicy"))}}
