"""Any promotion status read back, even an inconsistent one (edited by hand, or written by another version of the
operator), becomes a consistent one before a transition reads it (pure).

`advance` then relies on the invariants the tests check for any input: one stable version at most; candidate, stable
and previous distinct; a phase that has the versions and times it needs.
"""

from __future__ import annotations

from arbiter_operator.api.promotion import IN_PROGRESS, STOPPING
from arbiter_operator.api.times import format_time, parse_time
from arbiter_operator.promotion.run import Run


def normalise(run: Run) -> None:
    """Make `run.st` consistent: no candidate that is also stable, no previous version outside Cooling, a phase
    that fits the versions it names, the weight its phase and step give."""
    st = run.st
    if st.candidate is not None and st.candidate == st.stable:
        run.set(candidate=None)
    if run.st.previous is not None and (
        run.st.stable is None or run.st.previous in (run.st.stable, run.st.candidate)
    ):
        run.set(previous=None)
    phase = run.st.phase
    if phase in IN_PROGRESS + STOPPING and run.st.candidate is None:
        phase = "Failed" if phase == "RollingBack" else "Idle"
    if phase == "Failed":
        run.set(candidate=None)  # a failed candidate is never kept: it is not live, so it gets stopped
        if run.st.failedVersion is None:
            phase = "Idle"
    if phase in ("Idle", "Cooling", "Promoted") and run.st.candidate is not None:
        # A candidate recorded outside a promotion phase: resume its promotion from the start (it stays warm).
        phase = "Deploying"
        if run.st.startedAt is None:
            run.set(startedAt=format_time(run.now))
    if phase == "Promoted":
        phase = "Cooling" if run.st.previous else "Idle"
    if phase == "Cooling" and (run.st.previous is None or parse_time(run.st.coolingUntil) is None):
        phase = "Idle"
    if phase != "Cooling" and run.st.previous is not None:
        run.set(previous=None, coolingUntil=None)
    if phase == "Progressing" and (run.st.step < 0 or parse_time(run.st.stepStartedAt) is None):
        phase = "Waiting"
    if phase == "Shadowing" and (run.st.stable is None or parse_time(run.st.stepStartedAt) is None):
        phase = "Waiting"
    if phase == "Paused" and run.st.stable is None:
        phase = "Waiting"
    if phase == "Shadowing":
        run.set(step=-1)
    if phase in ("Deploying", "Waiting") and parse_time(run.st.startedAt) is None:
        run.set(startedAt=format_time(run.now))
    if phase in ("Deploying", "Waiting"):
        run.set(step=-1, weight=0)
    run.set(phase=phase)
    if phase == "Progressing":
        steps = run.inp.spec.steps
        # Weight follows the spec's step; a step index beyond a shortened spec keeps a canary-sized weight.
        w = steps[run.st.step].weight if run.st.step < len(steps) else max(1, min(99, run.st.weight or 50))
        run.set(weight=w)
    elif phase == "Paused":
        # Paused after the last canary step keeps that step's weight; after a shadow phase or Immediate, none.
        steps = run.inp.spec.steps
        canary = run.inp.spec.strategy == "Canary" and 0 <= run.st.step < len(steps)
        run.set(weight=steps[run.st.step].weight if canary else 0, step=run.st.step if canary else -1)
    else:
        run.set(weight=0)
