"""What a user can reach, as conditions (pure): Serving (a version answers), Exposed (the Route reaches it) and Ready
(the two with the promotion's verdict), and the Events a pass posts when Ready changes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..api import conditions as c
from ..api.conditions import Condition, make_condition, set_condition
from ..api.models import DecisionModel, DecisionModelStatus
from ..promotion.machine import CANDIDATE_FAILED, PromotionPlan, ReadyVerdict
from .children import Desired
from .exposure import TARGET_PORT_MISSING, route_backend_problem
from .model import Event, Observations
from .predictors import CRASH_LOOP, FAILED_CREATE, IMAGE_PULL, UNSCHEDULABLE
from .signals import TRANSIENT_REASONS
from .versions import VersionsSeen

PREDICTOR_CAUSES = (FAILED_CREATE, UNSCHEDULABLE, CRASH_LOOP, IMAGE_PULL, *TRANSIENT_REASONS)


class ConditionSet:
    """The conditions one pass writes, each made at the DecisionModel's generation with the pass's one clock
    reading."""

    def __init__(self, conditions: list[Condition], generation: int, now: datetime) -> None:
        self.items = list(conditions)
        self.generation = generation
        self.now = now

    def set(self, type_: str, status: str, reason: str, message: str) -> None:
        made = make_condition(type_, status, reason, message, self.generation, self.now)  # type: ignore[arg-type]
        self.items = set_condition(self.items, made)

    def put(self, condition: Condition) -> None:
        self.items = set_condition(self.items, condition)

    def get(self, type_: str) -> Condition | None:
        return c.get_condition(self.items, type_)

    def at_generation(self) -> list[Condition]:
        """Every condition was (re)considered against this generation; kstatus and `kubectl wait` compare them to
        it."""
        gen = self.generation
        return [x if x.observedGeneration == gen else x.model_copy(update={"observedGeneration": gen})
                for x in self.items]


def set_serving(conds: ConditionSet, dm: DecisionModel, pplan: PromotionPlan, desired: Desired,
                seen: VersionsSeen) -> None:
    """Serving: the traffic split while a version serves; otherwise what keeps the live versions from serving."""
    target, names, live = dm.spec.promote.version, seen.names, desired.live
    note = retained_note(desired.retained, pplan.status, target, names)
    traffic = dict(pplan.traffic)
    if traffic:
        share = ", ".join(f"{v} {w}%" for v, w in sorted(traffic.items(), key=lambda vw: (-vw[1], vw[0])))
        conds.set(c.SERVING, "True", "VersionReady", f"Serving {share}{note}")
        return
    vobs, problems = seen.observations, seen.problems
    waiting = [f"{v}: {vobs[v].message}" for v in live if v in vobs and vobs[v].message]
    msg = "No live version is ready yet" + (f" ({'; '.join(waiting)})" if waiting else "")
    msg += "; check the InferenceService and predictor pods (oc describe isvc, oc logs)"
    msg += note
    # The cause the pods show (the scheduler's message, a crash loop) names the reason, not just "not ready".
    culprit = next((v for v in [*live, *sorted(problems)] if v in problems), None)
    reason = problems[culprit].reason if culprit else "NoReadyVersion"
    if culprit and culprit not in live:  # a failed version is no longer live: still say what its pods show
        msg += f"; {culprit}: {problems[culprit].message}"
    elif culprit is None and (held_reason := _rolled_back_cause(dm.status, pplan.status)) is not None:
        # The failed version's pods are gone with it (nothing served, nothing to roll back to): the cause they
        # showed stays the reason until a retry or a spec change, so the user still reads why.
        reason = held_reason
        msg += f"; {pplan.status.failedVersion} was stopped: {pplan.status.failureMessage}"
    conds.set(c.SERVING, "False", reason, msg)


def set_exposed(conds: ConditionSet, dm: DecisionModel, obs: Observations, route: dict[str, Any] | None) -> str | None:
    """Exposed: whether the Route the plan applies reaches ready backends. Returns the Route's URL, where known."""
    url, admitted, route_msg = route_url(dm, obs.one("Route"))
    if admitted is False:
        conds.set(c.EXPOSED, "False", "RouteNotAdmitted",
                  f"Route {dm.metadata.name} was not admitted: {route_msg}; fix spec.exposure.host or the router shard")
    elif route is None:
        conds.set(c.EXPOSED, "False", "NoReadyBackend", "The Route is created once a version is ready")
    elif (unreachable := route_backend_problem(dm, route, obs.predictor_services)) is not None:
        conds.set(c.EXPOSED, "False", TARGET_PORT_MISSING, unreachable)
    else:
        # The Route is applied in this same reconcile (a refused write says so on Reconciling, one another owner
        # holds turns this False: apply.py).
        where = url or "the router's default host"
        reason = "RouteAdmitted" if admitted else "RouteConfigured"
        conds.set(c.EXPOSED, "True", reason, f"Route {dm.metadata.name} sends traffic to ready backends at {where}")
    return url


def set_ready(conds: ConditionSet, verdict: ReadyVerdict) -> None:
    """Ready: the promotion's verdict, when Serving and Exposed agree; else the first of them that does not."""
    serving = conds.get(c.SERVING)
    exposed = conds.get(c.EXPOSED)
    if verdict.status == "True" and serving.status == "True" and exposed.status != "False":  # type: ignore[union-attr]
        conds.set(c.READY, "True", verdict.reason, verdict.message)
    elif verdict.status == "False":
        conds.set(c.READY, "False", verdict.reason, verdict.message)
    elif serving.status != "True":  # type: ignore[union-attr]
        conds.set(c.READY, "False", serving.reason, serving.message)  # type: ignore[union-attr]
    else:
        conds.set(c.READY, "False", exposed.reason, exposed.message)  # type: ignore[union-attr]


def ready_events(old: DecisionModelStatus, new_ready: Condition | None, events: list[Event]) -> list[Event]:
    """`events` with the Ready transition's Event: becoming Ready, or losing it (the first Ready=False of a new
    resource is no news)."""
    old_ready = c.get_condition(old.conditions, c.READY)
    events = list(events)
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
    return events


def route_url(dm: DecisionModel, route: dict[str, Any] | None) -> tuple[str | None, bool | None, str]:
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


def retained_note(retained: list[str], st: Any, target: str, names: tuple[str, ...]) -> str:
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


def _rolled_back_cause(old: DecisionModelStatus, st: Any) -> str | None:
    """The predictor cause (FailedCreate, Unschedulable, CrashLoopBackOff) the last Serving condition named, while
    the promotion stays stopped on that version's failure; None otherwise."""
    if st is None or st.phase not in ("RollingBack", "Failed") or st.failureReason != CANDIDATE_FAILED:
        return None
    serving = c.get_condition(old.conditions, c.SERVING)
    if serving is None or serving.status != "False" or serving.reason not in PREDICTOR_CAUSES:
        return None
    return serving.reason
