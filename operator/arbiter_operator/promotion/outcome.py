"""What a reconcile's promotion status means for the rest of it (pure): the versions that must run, where traffic
goes, what the Promoted, Stalled, Reconciling and Ready conditions say, and when to look again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from arbiter_operator.api.backoff import LOADING_POLL
from arbiter_operator.api.conditions import PROMOTED, RECONCILING, STALLED, Condition, make_condition
from arbiter_operator.api.names import APPROVE_ANNOTATION, RETRY_ANNOTATION
from arbiter_operator.api.promotion import IN_PROGRESS, STOPPING, PromotionStatus
from arbiter_operator.api.times import format_time, parse_time
from arbiter_operator.promotion.model import ABORTED, UNKNOWN_VERSION, ReadyVerdict, VersionObservation
from arbiter_operator.promotion.run import Run
from arbiter_operator.promotion.schedule import next_analysis_at

# While waiting on something that has no timer (a candidate being deleted, a candidate turning ready during a canary),
# poll at this pace; the operator's watch on its children usually wakes it sooner.
POLL_SECONDS = 2.0
# While a version loads (Deploying, Waiting), the requeue is a safety net, 60 s backing off to 5 min with the time
# spent loading (api/backoff.py LOADING_POLL): KServe's status, the predictor Deployment and its pods are watched and
# wake the operator the moment the version is ready or in trouble. (A 2-15 s poll here cost most of the reconcile
# passes of a fleet rolling out.)
POLL_MAX_SECONDS = LOADING_POLL.cap


def loading_poll(elapsed: float) -> float:
    """Seconds until the next look at a version that has been loading for `elapsed` seconds: backing off with the
    time spent loading (api/backoff.LOADING_POLL). Loading a large model takes minutes, and KServe's status change
    wakes the operator through its watch the moment the version is ready: the poll is a safety net, and at a fixed
    2 s it cost most of the reconcile passes of a fleet rolling out."""
    return LOADING_POLL.delay(elapsed)


def live_versions(st: PromotionStatus, obs: Mapping[str, VersionObservation],
                  pinned: frozenset[str] = frozenset()) -> frozenset[str]:
    """The versions whose InferenceService must exist: stable, the candidate in progress, previous while Cooling, and
    the versions a context is pinned to (once their artifacts are known valid, or already deployed)."""
    live = {v for v in pinned if obs.get(v, VersionObservation()).artifacts_valid is True
            or obs.get(v, VersionObservation()).exists}
    if st.stable:
        live.add(st.stable)
    # A candidate still Deploying whose artifacts are unchecked has nothing live yet.
    unchecked = st.phase == "Deploying" and obs.get(st.candidate or "", VersionObservation()).artifacts_valid is None
    if st.candidate and st.phase in IN_PROGRESS and not unchecked:
        live.add(st.candidate)
    if st.previous and st.phase == "Cooling":
        live.add(st.previous)
    return frozenset(live)


def route_traffic(
    st: PromotionStatus, live: frozenset[str], obs: Mapping[str, VersionObservation], held: bool = False
) -> dict[str, int]:
    """Where requests go: only to live, ready versions, summing to 100; empty only when none is ready. held: the
    candidate may take none (a required audit is not ready), not even as the last warm version."""

    def ready(v: str | None) -> bool:
        return v is not None and v in live and obs.get(v, VersionObservation()).ready

    intended: dict[str, int] = {}
    if st.stable:
        intended[st.stable] = 100
    if st.phase in ("Progressing", "Paused") and st.candidate and 0 < st.weight < 100 and st.stable:
        intended = {st.stable: 100 - st.weight, st.candidate: st.weight}
    ready_part = {v: w for v, w in intended.items() if ready(v) and w > 0}
    if len(ready_part) == len(intended) and ready_part:
        return ready_part
    if len(ready_part) == 1:
        return {next(iter(ready_part)): 100}
    # Never traffic to nothing: fall back on any warm, ready version (previous first: it was proven).
    for v in (st.stable, st.previous, None if held else st.candidate):
        if ready(v):
            return {v: 100}  # type: ignore[dict-item]
    return {}


def conditions(run: Run, traffic: Mapping[str, int]) -> tuple[Condition, Condition, Condition, ReadyVerdict]:
    """Promoted, Stalled and Reconciling, and what Ready says of the promotion."""
    inp, st = run.inp, run.st
    gen, now = inp.generation, run.now
    target = inp.spec.version

    def cond(t: str, s: str, r: str, m: str) -> Condition:
        return make_condition(t, s, r, m, gen, now)  # type: ignore[arg-type]

    if target not in inp.versions:
        msg = f"spec.promote.version {target!r} is not one of spec.versions; fix the spec"
        return (
            cond(PROMOTED, "False", UNKNOWN_VERSION, msg),
            cond(STALLED, "True", UNKNOWN_VERSION, msg),
            cond(RECONCILING, "False", UNKNOWN_VERSION, msg),
            ReadyVerdict("False", UNKNOWN_VERSION, msg),
        )
    if st.phase in ("RollingBack", "Failed") and st.failureReason:
        serving = f"{st.stable} keeps serving" if st.stable else "no version serves"
        how = f"change the spec or set a new {RETRY_ANNOTATION} annotation value (kubectl arbiter retry) to try again"
        msg = f"Promotion of {st.failedVersion or st.candidate} failed: {st.failureMessage}. {serving}; {how}"
        return (
            cond(PROMOTED, "False", st.failureReason, msg),
            cond(STALLED, "True", st.failureReason, msg),
            cond(RECONCILING, "False", st.failureReason, msg),
            ReadyVerdict("False", st.failureReason, msg),
        )
    if st.phase in IN_PROGRESS:
        reason, msg = _in_progress(run)
        stalled = inp.hold is not None and inp.hold.stalled
        return (
            cond(PROMOTED, "False", reason, msg),
            cond(STALLED, "True" if stalled else "False", reason, msg),
            cond(RECONCILING, "False" if stalled else "True", reason, msg),
            ReadyVerdict("False", reason, msg),
        )
    # Idle, Cooling, Aborted: the promoted version is stable.
    if st.stable == target and traffic.get(target) == 100:
        reason = ABORTED if st.phase == "Aborted" else "Promoted"
        msg = f"{target} receives 100% of traffic"
        if st.phase == "Cooling":
            msg += f"; {st.previous} stays warm for rollback until {st.coolingUntil}"
        if st.phase == "Aborted":
            msg += f"; stopping aborted candidate {st.candidate}"
        return (
            cond(PROMOTED, "True", reason, msg),
            cond(STALLED, "False", reason, msg),
            cond(RECONCILING, "True" if st.phase == "Aborted" else "False", reason, msg),
            ReadyVerdict("True", reason, msg),
        )
    msg = f"{target} is stable but not ready: no traffic can reach it" if st.stable == target else f"{target} pending"
    # The stable version itself is down (pods crashing, node lost): not a promotion in progress, so not Reconciling;
    # Serving/Ready say it, and Argo CD shows Degraded rather than an endless Progressing.
    return (
        cond(PROMOTED, "False", "NotReady", msg),
        cond(STALLED, "False", "NotReady", msg),
        cond(RECONCILING, "False", "NotReady", msg),
        ReadyVerdict("False", "NotReady", msg),
    )


def _in_progress(run: Run) -> tuple[str, str]:
    """The reason and message of a promotion in progress: its phase, what it waits on, and an outage holding it."""
    inp, st = run.inp, run.st
    if st.phase == "Progressing":
        n = len(inp.spec.steps)
        msg = f"Canary step {st.step + 1}/{n}: {st.weight}% of traffic to {st.candidate}"
        if st.lastAnalysis is not None:
            msg += f"; last analysis {st.lastAnalysis.verdict}: {st.lastAnalysis.message}"
    elif st.phase == "Shadowing":
        msg = f"Shadow: {st.candidate} gets a mirrored sample of {st.stable}'s requests, no live traffic"
        if st.lastAnalysis is not None:
            msg += f"; last analysis {st.lastAnalysis.verdict}: {st.lastAnalysis.message}"
    elif st.phase == "Paused":
        msg = (
            f"{st.candidate} passed its analysis and waits for approval ({st.weight}% of traffic): "
            f"kubectl arbiter approve, or set the {APPROVE_ANNOTATION}={st.candidate} annotation"
        )
    elif st.phase == "Waiting":
        msg = f"Waiting for {st.candidate} to become ready"
    else:
        msg = f"Deploying {st.candidate}"
    if st.stable:
        msg += f"; {st.stable} serves the rest"
    reason = "WaitingForApproval" if st.phase == "Paused" else "Progressing"
    if inp.hold is not None:  # the candidate takes no (more) traffic until it clears
        return inp.hold.reason, f"{msg}; held: {inp.hold.message}"
    held = run.obs(st.candidate)
    if held.held:  # an outage outside the candidate: the reason names it, and how long the promotion waits
        reason = held.held
        until = run.deadline()
        msg += (f"; held: {held.message}. This is an outage, not the candidate's failure: the promotion goes on "
                f"by itself once it clears" + (f", and rolls back at {format_time(until)} (progress deadline)"
                                                if until is not None else ""))
    return reason, msg


def requeue_after(run: Run) -> float | None:
    """Seconds until the next reconcile must look: a deadline, an analysis due, the end of the rollback window, or a
    poll while a version loads or stops; None: nothing is timed."""
    st, spec = run.st, run.inp.spec
    times: list[datetime] = []
    if st.phase == "Cooling" and (u := parse_time(st.coolingUntil)):
        times.append(u)
    if st.phase in IN_PROGRESS:
        if (d := run.deadline()) is not None:
            times.append(d)
        nxt = next_analysis_at(spec, st)
        if nxt is not None:
            times.append(nxt[0])
    out: float | None = None
    if times:
        # Status times have whole seconds; waking just after the boundary keeps overhead under a second.
        out = max(0.5, (min(times) - run.inp.now).total_seconds() + 0.05)
    if st.phase in ("Deploying", "Waiting") or st.phase in STOPPING or (
        st.phase in ("Progressing", "Shadowing") and not run.obs(st.candidate).ready
    ):
        poll = POLL_SECONDS
        if st.phase in ("Deploying", "Waiting") and (started := parse_time(st.startedAt)) is not None:
            poll = loading_poll((run.inp.now - started).total_seconds())
        out = poll if out is None else min(out, poll)
    return out
