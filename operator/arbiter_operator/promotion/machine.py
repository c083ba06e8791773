"""The promotion state machine: (spec.promote, status.promotion, observations, analysis) -> next status and plan.

Pure: no I/O, no clock (the caller passes `now`). Every reconcile calls `advance` once; the result depends only on its
inputs, so a restarted operator that reads status back resumes where the last one stopped. The invariants the tests
check for any input (including arbitrary, inconsistent status):
- one stable version at most; candidate, stable and previous are distinct;
- `live` (the versions whose InferenceService must exist) holds only stable, candidate, previous and the versions a
  context is pinned to (`inputs.pinned`);
- `traffic` names only live, ready versions and sums to 100, and is empty only when no live version is ready.
See docs/operations.md ("Promotion") for the user-facing semantics.

`advance` composes the steps, each in a module of its own: normalise the status read back (normalise), take the
transition (transitions, acting through run.Run), then read the plan off the new status (outcome).
"""

from __future__ import annotations

from arbiter_operator.api.promotion import PromotionStatus
from arbiter_operator.promotion.bounds import DEFAULT_SHADOW
from arbiter_operator.promotion.history import HISTORY_LIMIT
from arbiter_operator.promotion.model import (
    CANDIDATE_FAILED,
    PromotionInputs,
    PromotionPlan,
    ReadyVerdict,
    ShadowPlan,
    VersionObservation,
)
from arbiter_operator.promotion.normalise import normalise
from arbiter_operator.promotion.outcome import conditions, live_versions, requeue_after, route_traffic
from arbiter_operator.promotion.run import Run
from arbiter_operator.promotion.schedule import whole_seconds
from arbiter_operator.promotion.transitions import first_deployment, step_machine

# The planner imports the machine's vocabulary from here, next to `advance`.
__all__ = [
    "CANDIDATE_FAILED",
    "HISTORY_LIMIT",
    "PromotionInputs",
    "PromotionPlan",
    "ReadyVerdict",
    "ShadowPlan",
    "VersionObservation",
    "advance",
]


def advance(inputs: PromotionInputs) -> PromotionPlan:
    """One reconcile of the promotion: the next status, what must run, where traffic goes, and what to say."""
    now = whole_seconds(inputs.now)
    run = Run(inp=inputs, now=now, st=inputs.status.model_copy(deep=True) if inputs.status else PromotionStatus())
    normalise(run)
    if run.st.stable is None:
        first_deployment(run)
    else:
        step_machine(run)
    obs = inputs.observations
    live = live_versions(run.st, obs, inputs.pinned)
    traffic = route_traffic(run.st, live, obs, held=inputs.hold is not None)
    promoted, stalled, reconciling, ready = conditions(run, traffic)
    shadow = None
    st = run.st
    if st.phase == "Shadowing" and st.stable and st.candidate and st.candidate in live and st.stable in live:
        sh = inputs.spec.shadow or DEFAULT_SHADOW
        shadow = ShadowPlan(st.stable, st.candidate, sh.sampleRate, sh.timeoutMs, sh.maxInFlight)
    return PromotionPlan(
        status=run.st,
        live=live,
        traffic=traffic,
        promoted=promoted,
        stalled=stalled,
        reconciling=reconciling,
        ready=ready,
        events=tuple(run.events),
        requeue_after=requeue_after(run),
        shadow=shadow,
    )
