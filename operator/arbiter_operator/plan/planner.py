"""One reconcile, planned: see plan/__init__.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from ..api import conditions as c
from ..api.conditions import Condition, make_condition, set_condition
from ..api.models import Address, DecisionModel, DecisionModelStatus, ModelVersion, VersionStatus, isvc_name
from ..api.names import ABORT_ANNOTATION, APPROVE_ANNOTATION, CORE_API, ISVC_API, RBAC_API, RETRY_ANNOTATION
from ..promotion.machine import CANDIDATE_FAILED, PromotionInputs, PromotionPlan, VersionObservation, advance
from ..render import (
    configmap_name,
    render_configmap,
    render_inferenceservice,
    render_podmonitor,
    render_route,
    render_servingruntime,
    render_stable_service,
    stable_service_url,
)
from ..render.common import LABEL_VERSION
from ..render.shadow_rbac import render_shadow_rbac
from .exposure import TARGET_PORT_MISSING, route_backend_problem
from .model import ArtifactObservation, Event, Observations, Plan
from .predictors import (
    CRASH_LOOP,
    FAILED_CREATE,
    IMAGE_PULL,
    UNSCHEDULABLE,
    PredictorProblem,
    as_map,
    as_maps,
    deployment_available,
    deployment_problem,
    predictor_problem,
)
from .recheck import recheck_after, sooner
from .signals import TRANSIENT_REASONS, classify_message
from .validate import spec_problems

INVALID_SPEC = "InvalidSpec"
# KServe's model transition states that mean "this will not become ready without a change".
FAILED_TRANSITIONS = {"BlockedByFailedLoad", "InvalidSpec"}
PREDICTOR_CAUSES = (FAILED_CREATE, UNSCHEDULABLE, CRASH_LOOP, IMAGE_PULL, *TRANSIENT_REASONS)


def isvc_state(isvc: dict[str, Any] | None) -> tuple[bool, bool, bool, str]:
    """(exists, ready, failed, message) from an InferenceService's KServe status."""
    if isvc is None:
        return False, False, False, ""
    # Read as any shape: the status is KServe's (or anybody's) to write, and a field of the wrong type means "not
    # said", never an exception in the reconcile or in the watch handler that judges the event.
    status = as_map(isvc.get("status"))
    ready_cond = next((x for x in as_maps(status.get("conditions")) if x.get("type") == "Ready"), None)
    ready = bool(ready_cond and ready_cond.get("status") == "True")
    model_status = as_map(status.get("modelStatus"))
    transition = model_status.get("transitionStatus")
    failed = isinstance(transition, str) and transition in FAILED_TRANSITIONS
    message: Any = ""
    if failed:
        info = as_map(model_status.get("lastFailureInfo"))
        message = info.get("message") or info.get("reason") or transition
        # KServe records what it met, outages included: a failure that is one (plan/signals.py) only holds.
        failed = not classify_message(str(message), "Failed").transient
    elif ready_cond and not ready:
        message = ready_cond.get("message") or ready_cond.get("reason") or ""
    return True, ready, failed, message if isinstance(message, str) else str(message)


def _held_reason(message: str) -> str:
    """The transient reason KServe's own message shows (its webhook or the apiserver out), else none."""
    verdict = classify_message(message, "")
    return verdict.reason if verdict.transient else ""


def _workload_state(
    name: str, ready: bool, failed: bool, message: str, obs: Observations, serves: bool = False
) -> tuple[bool, bool, str, PredictorProblem | None]:
    """A version is ready when KServe says so and its predictor Deployment has an available replica (of its latest
    spec, unless the version already serves: then a scale or rollout in progress takes nothing away); when it is not,
    the pods say why (unschedulable, crash loop)."""
    if ready and not deployment_available(obs.predictor_deployments.get(name), current_spec=not serves):
        ready = False
        message = f"predictor Deployment {name}-predictor has no available replica"
    if ready:
        return ready, failed, message, None
    problem = deployment_problem(obs.predictor_deployments.get(name)) or predictor_problem(
        obs.predictor_pods.get(name, ()))
    if problem is None:
        return ready, failed, message, None
    return ready, failed or problem.failed, problem.message, problem


def _route_url(dm: DecisionModel, route: dict[str, Any] | None) -> tuple[str | None, bool | None, str]:
    """(url, admitted, message). admitted None: no router has answered yet."""
    if route is None:
        return None, None, ""
    for ingress in (route.get("status") or {}).get("ingress") or []:
        admitted = next((x for x in ingress.get("conditions") or [] if x.get("type") == "Admitted"), None)
        if admitted is None:
            continue
        if admitted.get("status") == "True":
            host = ingress.get("host") or (route.get("spec") or {}).get("host")
            return (f"https://{host}" if host else None), True, ""
        return None, False, admitted.get("message") or admitted.get("reason") or "rejected by the router"
    host = (route.get("spec") or {}).get("host") or dm.spec.exposure.host
    return (f"https://{host}" if host else None), None, ""


def _phase(exists: bool, ready: bool, failed: bool, live: bool, art: ArtifactObservation) -> str:
    if art.valid is False:
        return "Invalid"
    if failed:
        return "Failed"
    if ready and live:
        return "Ready"
    # A live version's InferenceService is applied in this same reconcile (a failed apply fails the reconcile before
    # the status is written): it is Deploying from this pass on, so its appearance needs no status write of its own.
    return "Deploying" if live else "Stopped"


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


def plan(dm: DecisionModel, obs: Observations, now: datetime) -> Plan:
    gen = dm.metadata.generation
    old = dm.status
    conditions: list[Condition] = list(old.conditions)

    def cond(type_: str, status: str, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, make_condition(type_, status, reason, message, gen, now))  # type: ignore[arg-type]

    events: list[Event] = []
    old_ready = c.get_condition(old.conditions, c.READY)

    refused = spec_problems(dm)
    if refused:
        # What serves keeps serving: no child is touched, the promotion does not move; the user must fix the spec.
        msg = "; ".join(refused) + ". Nothing was changed: fix the spec to continue."
        cond(c.STALLED, "True", INVALID_SPEC, msg)
        cond(c.RECONCILING, "False", INVALID_SPEC, msg)
        cond(c.READY, "False", INVALID_SPEC, msg)
        status = old.model_copy(update={"observedGeneration": gen, "conditions": _at_generation(conditions, gen)})
        if old_ready is None or old_ready.status != "False" or old_ready.reason != INVALID_SPEC:
            events.append(Event("Warning", INVALID_SPEC, msg))
        return Plan(None, [], _dump(status), events, None)

    versions = {v.name: v for v in dm.spec.versions}
    names = tuple(versions)
    # The InferenceService of each version (see `serving_inferenceservices`).
    isvc_by_version = serving_inferenceservices(dm.metadata.name, obs.of_kind("InferenceService"))

    # The versions that served when the last status was written (the stable one, the previous one kept warm).
    before = old.promotion
    serving_before = {v for v in (before.stable, before.previous) if v} if before is not None else set()
    vobs: dict[str, VersionObservation] = {}
    problems: dict[str, PredictorProblem] = {}
    for v in set(names) | set(isvc_by_version):
        message: str | None
        exists, ready, failed, message = isvc_state(isvc_by_version.get(v))
        held = "" if ready or failed or not message else _held_reason(message)
        if exists and obs.workloads_observed:
            ready, failed, message, problem = _workload_state(
                isvc_name(dm.metadata.name, v), ready, failed, message, obs, serves=v in serving_before)
            if problem is not None:
                problems[v] = problem
                held = problem.reason if problem.transient and not failed else held
        art = obs.artifacts.get(v, ArtifactObservation())
        vobs[v] = VersionObservation(
            exists=exists, ready=ready, failed=failed, message=message, artifacts_valid=art.valid, held=held
        )

    promote = dm.spec.promote
    target = versions.get(promote.version)
    pplan = advance(
        PromotionInputs(
            spec=promote,
            status=old.promotion,
            versions=names,
            observations=vobs,
            candidate_sla_p95_ms=float(target.metadata.sla.p95LatencyMs) if target else None,
            analysis=obs.analysis,
            retry_annotation=dm.metadata.annotations.get(RETRY_ANNOTATION),
            abort_annotation=dm.metadata.annotations.get(ABORT_ANNOTATION),
            approve_annotation=dm.metadata.annotations.get(APPROVE_ANNOTATION),
            generation=gen,
            now=now,
        )
    )
    events.extend(pplan.events)

    children, deletions, live, retained, stable, route = _desired(dm, obs, pplan, versions, isvc_by_version)

    # Conditions: promotion's three, then Serving / Exposed / Ready from what the user can reach.
    for pc in (pplan.promoted, pplan.stalled, pplan.reconciling):
        conditions = set_condition(conditions, pc)
    traffic = dict(pplan.traffic)
    if traffic:
        share = ", ".join(f"{v} {w}%" for v, w in sorted(traffic.items(), key=lambda vw: (-vw[1], vw[0])))
        note = _retained_note(retained, pplan.status, promote.version, names)
        cond(c.SERVING, "True", "VersionReady", f"Serving {share}{note}")
    else:
        waiting = [f"{v}: {vobs[v].message}" for v in live if v in vobs and vobs[v].message]
        msg = "No live version is ready yet" + (f" ({'; '.join(waiting)})" if waiting else "")
        msg += "; check the InferenceService and predictor pods (oc describe isvc, oc logs)"
        msg += _retained_note(retained, pplan.status, promote.version, names)
        # The cause the pods show (the scheduler's message, a crash loop) names the reason, not just "not ready".
        culprit = next((v for v in [*live, *sorted(problems)] if v in problems), None)
        reason = problems[culprit].reason if culprit else "NoReadyVersion"
        if culprit and culprit not in live:  # a failed version is no longer live: still say what its pods show
            msg += f"; {culprit}: {problems[culprit].message}"
        elif culprit is None and (held_reason := _rolled_back_cause(old, pplan.status)) is not None:
            # The failed version's pods are gone with it (nothing served, nothing to roll back to): the cause they
            # showed stays the reason until a retry or a spec change, so the user still reads why.
            reason = held_reason
            msg += f"; {pplan.status.failedVersion} was stopped: {pplan.status.failureMessage}"
        cond(c.SERVING, "False", reason, msg)

    url, admitted, route_msg = _route_url(dm, obs.one("Route"))
    if admitted is False:
        cond(c.EXPOSED, "False", "RouteNotAdmitted",
             f"Route {dm.metadata.name} was not admitted: {route_msg}; fix spec.exposure.host or the router shard")
    elif route is None:
        cond(c.EXPOSED, "False", "NoReadyBackend", "The Route is created once a version is ready")
    elif (unreachable := route_backend_problem(dm, route, obs.predictor_services)) is not None:
        cond(c.EXPOSED, "False", TARGET_PORT_MISSING, unreachable)
    else:
        # The Route is applied in this same reconcile (a refused write says so on Reconciling, one another owner
        # holds turns this False: apply.py).
        where = url or "the router's default host"
        reason = "RouteAdmitted" if admitted else "RouteConfigured"
        cond(c.EXPOSED, "True", reason, f"Route {dm.metadata.name} sends traffic to ready backends at {where}")

    for extra in obs.extra_conditions:
        conditions = set_condition(conditions, extra)

    serving = c.get_condition(conditions, c.SERVING)
    exposed = c.get_condition(conditions, c.EXPOSED)
    if pplan.ready.status == "True" and serving.status == "True" and exposed.status != "False":  # type: ignore[union-attr]
        cond(c.READY, "True", pplan.ready.reason, pplan.ready.message)
    elif pplan.ready.status == "False":
        cond(c.READY, "False", pplan.ready.reason, pplan.ready.message)
    elif serving.status != "True":  # type: ignore[union-attr]
        cond(c.READY, "False", serving.reason, serving.message)  # type: ignore[union-attr]
    else:
        cond(c.READY, "False", exposed.reason, exposed.message)  # type: ignore[union-attr]

    new_ready = c.get_condition(conditions, c.READY)
    # Transitions only: becoming Ready, or losing it (the first Ready=False of a new resource is no news).
    if new_ready and new_ready.status == "True" and (old_ready is None or old_ready.status != "True"):
        # Becoming Ready by a first deployment's promotion: one Event, with the promotion's message (a first
        # rollout posts no PromotionStarted/CandidateDeployed either: its progress is in status).
        first = old.promotion is None or old.promotion.stable is None
        promoted = next((e for e in events if e.reason == "Promoted"), None) if first else None
        if promoted is not None:
            events.remove(promoted)
        events.append(Event("Normal", "Ready", promoted.message if promoted else new_ready.message))
    elif new_ready and new_ready.status != "True" and old_ready is not None and old_ready.status == "True":
        events.append(Event("Warning", "NotReady", new_ready.message))

    images = {v: runtime_image(dm, isvc_by_version.get(v), obs.default_runtime_image) for v in live}
    for v in retained:  # kept as observed: report what it runs
        model = ((isvc_by_version[v].get("spec") or {}).get("predictor") or {}).get("model") or {}
        if isinstance(model.get("image"), str):
            images[v] = model["image"]
    vstatus: list[VersionStatus] = []
    for v in list(names) + sorted(set(isvc_by_version) - set(names)):
        o = vobs[v]
        art = obs.artifacts.get(v, ArtifactObservation())
        ids = obs.registry_ids.get(v, {})
        message = art.message if art.valid is False else (o.message or None)
        if v in retained:
            message = _retained_note([v], pplan.status, promote.version, names).removeprefix("; ")
        vstatus.append(
            VersionStatus(
                name=v,
                phase=_phase(o.exists, o.ready, o.failed, v in pplan.live, art),
                inferenceService=isvc_name(dm.metadata.name, v)
                if o.exists or v in pplan.live else None,
                ready=o.ready,
                registeredModelId=ids.get("registeredModelId"),
                modelVersionId=ids.get("modelVersionId"),
                modelArtifactId=ids.get("modelArtifactId"),
                artifactsDigest=art.digest,
                runtimeImage=images.get(v),
                tokensPerDecision=art.tokens_per_decision,
                message=message,
            )
        )

    active = max(traffic, key=lambda v: (traffic[v], v)) if traffic else old.activeVersion
    status = DecisionModelStatus(
        observedGeneration=gen,
        conditions=_at_generation(conditions, gen),
        activeVersion=active,
        url=url,
        address=Address(url=stable_service_url(dm)) if stable is not None or obs.one("Service") else None,
        versions=vstatus,
        promotion=pplan.status,
    )
    return Plan(children, deletions, _dump(status), events, sooner(pplan.requeue_after, recheck_after(conditions, now)))


def serving_inferenceservices(dm_name: str, owned: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per version (by its label): the InferenceService named isvc_name() for it. `owned` holds only this
    DecisionModel's children; one under another name speaks for no version (and is deleted as not wanted)."""
    objs: dict[str, dict[str, Any]] = {}
    for name, isvc in sorted(owned.items()):
        version = ((isvc.get("metadata") or {}).get("labels") or {}).get(LABEL_VERSION)
        if version and name == isvc_name(dm_name, version):
            objs[version] = isvc
    return objs


CHILD_CONFLICT = "ChildConflict"


def conflict_message(conflicts: list[str]) -> str:
    shown = conflicts[:4] + ([f"{len(conflicts) - 4} more"] if len(conflicts) > 4 else [])
    return ("; ".join(shown) + ". Arbiter writes only to objects whose controller is this DecisionModel: delete "
            "or rename those objects, or give this DecisionModel another name")


def with_child_conflicts(
    status: dict[str, Any], conflicts: list[str], generation: int, now: datetime
) -> dict[str, Any]:
    """The planned status, with the children other owners hold reported: Stalled=True and Ready=False, reason
    ChildConflict (a person must act; the operator retries, and the rest of the DecisionModel is reconciled)."""
    msg = conflict_message(conflicts)
    conditions = [Condition.model_validate(x) for x in status.get("conditions") or []]
    for type_ in (c.STALLED, c.READY):
        conditions = set_condition(
            conditions, make_condition(type_, "True" if type_ == c.STALLED else "False", CHILD_CONFLICT, msg,
                                       generation, now)
        )
    return {**status, "conditions": [x.model_dump(mode="json", exclude_none=True) for x in conditions]}


def _rolled_back_cause(old: DecisionModelStatus, st: Any) -> str | None:
    """The predictor cause (FailedCreate, Unschedulable, CrashLoopBackOff) the last Serving condition named, while
    the promotion stays stopped on that version's failure; None otherwise."""
    if st is None or st.phase not in ("RollingBack", "Failed") or st.failureReason != CANDIDATE_FAILED:
        return None
    serving = c.get_condition(old.conditions, c.SERVING)
    if serving is None or serving.status != "False" or serving.reason not in PREDICTOR_CAUSES:
        return None
    return serving.reason


def _retained_note(retained: list[str], st: Any, target: str, names: tuple[str, ...]) -> str:
    """What happens to live versions that left spec.versions (empty when there are none)."""
    out = []
    for v in retained:
        kept = f"{v} left spec.versions: its InferenceService is kept as it is and stopped once"
        if v == st.previous:
            out.append(f"{kept} the rollback window ends ({st.coolingUntil})")
        elif target in names:
            out.append(f"{kept} {target} (spec.promote.version) serves")
        else:
            out.append(f"{kept} spec.promote.version names a version of spec.versions and that version serves")
    return "".join(f"; {x}" for x in out)


def _at_generation(conditions: list[Condition], gen: int) -> list[Condition]:
    """Every condition was (re)considered against this generation; kstatus and `kubectl wait` compare them to it."""
    return [x if x.observedGeneration == gen else x.model_copy(update={"observedGeneration": gen}) for x in conditions]


def _dump(status: DecisionModelStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


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


def _desired(dm: DecisionModel, obs: Observations, pplan: PromotionPlan, versions: Mapping[str, ModelVersion],
             isvc_by_version: Mapping[str, dict[str, Any]]) -> Desired:
    """The children a plan applies and deletes, from the promotion's plan and what was observed."""
    # Desired children: the runtime, one ConfigMap + InferenceService per live version, the Route.
    children: list[dict[str, Any]] = [render_servingruntime(dm, obs.default_runtime_image)]
    live = [v for v in versions if v in pplan.live]  # spec order: stable rendering
    for v in live:
        art = obs.artifacts.get(v, ArtifactObservation())
        shadow = pplan.shadow if pplan.shadow is not None and pplan.shadow.stable == v else None
        cm = render_configmap(dm, versions[v], diffusion=art.diffusion, shadow=shadow)
        children.append(cm)
        children.append(
            render_inferenceservice(
                dm, versions[v], cm, obs.namespace_labels, obs.registry_ids.get(v), diffusion=art.diffusion,
                runtime_image=runtime_image(dm, isvc_by_version.get(v), obs.default_runtime_image),
                storage_key=art.storage_key,
            )
        )
    # While the stable version mirrors to the candidate, its pods may call the candidate (auth on); never otherwise.
    shadow_rbac = render_shadow_rbac(dm, pplan.shadow.candidate) if pplan.shadow and dm.spec.exposure.auth else []
    children.extend(shadow_rbac)
    if obs.podmonitor_api:
        children.append(render_podmonitor(dm))  # Prometheus scrapes the predictors: the promotion analysis needs it
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
    wanted_isvcs = {isvc_name(dm.metadata.name, v) for v in live + retained}
    wanted_cms = {configmap_name(dm.metadata.name, v) for v in live + retained}
    # The children that come and go (per version, per phase): those observed and no longer wanted are deleted.
    wanted = {(ISVC_API, "InferenceService"): wanted_isvcs, (CORE_API, "ConfigMap"): wanted_cms,
              **{(RBAC_API, kind): {c["metadata"]["name"] for c in shadow_rbac if c["kind"] == kind}
                 for kind in ("Role", "RoleBinding")}}
    deletions = unwanted(obs, wanted)
    return Desired(children, deletions, live, retained, stable, route)
