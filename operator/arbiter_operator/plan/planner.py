"""One reconcile, planned: see plan/__init__.py. `plan()` is the sequence of steps; each step's module says what it
decides (versions.py: what each version shows; children.py: what to apply and delete; readiness.py: Serving,
Exposed, Ready and their Events)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..api import conditions as c
from ..api.conditions import Condition, make_condition, set_condition
from ..api.models import Address, DecisionModel, DecisionModelStatus, VersionStatus, isvc_name
from ..api.names import ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION
from ..promotion.machine import PromotionInputs, PromotionPlan, advance
from ..render import stable_service_url
from .audit import promotion_hold
from .children import Desired, desired_children, runtime_image
from .model import ArtifactObservation, Event, Observations, Plan
from .readiness import ConditionSet, ready_events, retained_note, set_exposed, set_ready, set_serving
from .recheck import recheck_after, sooner
from .validate import spec_problems
from .versions import VersionsSeen, observe_versions

INVALID_SPEC = "InvalidSpec"


def plan(dm: DecisionModel, obs: Observations, now: datetime) -> Plan:
    """One pass: a spec that cannot be served as written is refused; otherwise the versions are observed, the
    promotion advances, the children are rendered, and the conditions, Events and status report the outcome."""
    refused = spec_problems(dm)
    if refused:
        return _refusal(dm, refused, now)
    seen = observe_versions(dm, obs)
    pplan = _advance_promotion(dm, obs, seen, now)
    desired = desired_children(dm, obs, pplan, seen.versions, seen.isvcs)

    # Conditions: promotion's three, then Serving / Exposed / Ready from what the user can reach.
    conds = ConditionSet(dm.status.conditions, dm.metadata.generation, now)
    for pc in (pplan.promoted, pplan.stalled, pplan.reconciling):
        conds.put(pc)
    set_serving(conds, dm, pplan, desired, seen)
    url = set_exposed(conds, dm, obs, desired.route)
    for extra in obs.extra_conditions:
        conds.put(extra)
    set_ready(conds, pplan.ready)
    events = ready_events(dm.status, conds.get(c.READY), list(pplan.events))

    status = _status(dm, obs, pplan, seen, desired, conds, url)
    requeue = sooner(pplan.requeue_after, recheck_after(conds.items, now))
    # A promotion starts in this pass: its start time or its candidate is new. Both, because startedAt has a second's
    # resolution: a promotion asked for in the second its first version began serving starts at the same time.
    before = dm.status.promotion
    after = pplan.status
    started = after.startedAt is not None and (
        after.startedAt != before.startedAt or (after.candidate is not None and after.candidate != before.candidate))
    return Plan(desired.children, desired.deletions, _dump(status), events, requeue,
                needs_request=started and obs.promotion_request is None)


def _refusal(dm: DecisionModel, refused: list[str], now: datetime) -> Plan:
    """A spec the operator cannot serve as written: what serves keeps serving (no child is touched, the promotion
    does not move); the conditions say what to fix, and an Event says it once."""
    gen, old = dm.metadata.generation, dm.status
    msg = "; ".join(refused) + ". Nothing was changed: fix the spec to continue."
    conds = ConditionSet(old.conditions, gen, now)
    conds.set(c.STALLED, "True", INVALID_SPEC, msg)
    conds.set(c.RECONCILING, "False", INVALID_SPEC, msg)
    conds.set(c.READY, "False", INVALID_SPEC, msg)
    status = old.model_copy(update={"observedGeneration": gen, "conditions": conds.at_generation()})
    old_ready = c.get_condition(old.conditions, c.READY)
    events: list[Event] = []
    if old_ready is None or old_ready.status != "False" or old_ready.reason != INVALID_SPEC:
        events.append(Event("Warning", INVALID_SPEC, msg))
    return Plan(None, [], _dump(status), events, None)


def _advance_promotion(dm: DecisionModel, obs: Observations, seen: VersionsSeen, now: datetime) -> PromotionPlan:
    """The promotion's step: which versions run, where traffic goes, what the promotion's status and Events say."""
    promote = dm.spec.promote
    target = seen.versions.get(promote.version)
    annotations = dm.metadata.annotations
    return advance(
        PromotionInputs(
            spec=promote,
            status=dm.status.promotion,
            versions=seen.names,
            observations=seen.observations,
            candidate_sla_p95_ms=float(target.metadata.sla.p95LatencyMs) if target else None,
            analysis=obs.analysis,
            retry_annotation=annotations.get(RETRY_ANNOTATION),
            abort_annotation=annotations.get(ABORT_ANNOTATION),
            approve_annotation=annotations.get(APPROVE_ANNOTATION),
            generation=dm.metadata.generation,
            now=now,
            request=obs.promotion_request,
            hold=promotion_hold(dm.spec.audit, next((x for x in obs.extra_conditions if x.type == c.AUDIT_READY),
                                                    None)),
            pinned=pinned_versions(dm),
        )
    )


def pinned_versions(dm: DecisionModel) -> frozenset[str]:
    """The versions spec.routing pins a context to (of those spec.versions names)."""
    routing = dm.spec.routing
    names = {v.name for v in dm.spec.versions}
    return frozenset(c.version for c in routing.contexts if c.version in names) if routing else frozenset()


def _status(dm: DecisionModel, obs: Observations, pplan: PromotionPlan, seen: VersionsSeen, desired: Desired,
            conds: ConditionSet, url: str | None) -> DecisionModelStatus:
    """The whole .status this pass writes."""
    traffic = pplan.traffic
    active = max(traffic, key=lambda v: (traffic[v], v)) if traffic else dm.status.activeVersion
    return DecisionModelStatus(
        observedGeneration=dm.metadata.generation,
        conditions=conds.at_generation(),
        activeVersion=active,
        url=url,
        address=Address(url=stable_service_url(dm)) if desired.stable is not None or obs.one("Service") else None,
        versions=_version_statuses(dm, obs, pplan, seen, desired),
        promotion=pplan.status,
    )


def _version_statuses(dm: DecisionModel, obs: Observations, pplan: PromotionPlan, seen: VersionsSeen,
                      desired: Desired) -> list[VersionStatus]:
    """status.versions: the spec's versions in spec order, then those that left it but still have an
    InferenceService."""
    names, retained = seen.names, desired.retained
    images = _runtime_images(dm, obs, seen, desired)
    vstatus: list[VersionStatus] = []
    for v in list(names) + sorted(set(seen.isvcs) - set(names)):
        o = seen.observations[v]
        art = obs.artifacts.get(v, ArtifactObservation())
        ids = obs.registry_ids.get(v, {})
        message = art.message if art.valid is False else (o.message or None)
        if v in retained:
            message = retained_note([v], pplan.status, dm.spec.promote.version, names).removeprefix("; ")
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
    return vstatus


def _runtime_images(dm: DecisionModel, obs: Observations, seen: VersionsSeen, desired: Desired) -> dict[str, str]:
    """The image each live version runs (as rendered), and each retained one (as observed)."""
    images = {v: runtime_image(dm, seen.isvcs.get(v), obs.default_runtime_image) for v in desired.live}
    for v in desired.retained:  # kept as observed: report what it runs
        model = ((seen.isvcs[v].get("spec") or {}).get("predictor") or {}).get("model") or {}
        if isinstance(model.get("image"), str):
            images[v] = model["image"]
    return images


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


def _dump(status: DecisionModelStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)
