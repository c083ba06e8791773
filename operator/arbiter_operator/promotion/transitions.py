"""The promotion's transitions: from the phase a status is in, and what was observed, to the next phase (pure).

`step_machine` runs a reconcile once a stable version serves, `first_deployment` before one does; both hand a
promotion in progress to `progress`, which follows spec.promote, stops the promotion when it must, and otherwise
takes the step its phase is waiting for: the candidate loaded, an approval, or an analysis verdict.
"""

from __future__ import annotations

from datetime import timedelta

from arbiter_operator.api.names import ABORT_ANNOTATION, APPROVE_ANNOTATION
from arbiter_operator.api.promotion import IN_PROGRESS, STOPPING, PromoteSpec, approves
from arbiter_operator.api.times import format_time, parse_time
from arbiter_operator.promotion.bounds import DEFAULT_SHADOW
from arbiter_operator.promotion.history import SUPERSEDED
from arbiter_operator.promotion.model import (
    ABORTED,
    ANALYSIS_FAILED,
    ARTIFACTS_INVALID,
    CANDIDATE_FAILED,
    DEADLINE_EXCEEDED,
    SHADOW_FAILED,
)
from arbiter_operator.promotion.run import Run
from arbiter_operator.promotion.schedule import hold_seconds


def uses_shadow(spec: PromoteSpec) -> bool:
    """Strategy Shadow, or a Canary with a shadow phase before its first step."""
    return spec.strategy == "Shadow" or (spec.strategy == "Canary" and spec.shadow is not None)


def step_machine(run: Run) -> None:
    """A reconcile once a stable version serves: stop a rolled-back candidate, start, restart or clear a promotion,
    end the rollback window, or go on with the promotion in progress."""
    inp, spec = run.inp, run.inp.spec
    target = spec.version
    if target not in inp.versions:
        return  # UnknownVersion: keep serving whatever serves; conditions say why
    st = run.st

    # Stopping a rolled-back or aborted candidate: done once its InferenceService is gone (or at once when a context
    # is pinned to it: it stays warm for that context, taking no other traffic).
    if st.phase in STOPPING:
        if not run.obs(st.candidate).exists or st.candidate in inp.pinned:
            stopped = st.candidate
            run.set(phase="Failed" if st.phase == "RollingBack" else "Idle", candidate=None)
            run.event("Normal", "CandidateStopped", f"InferenceService of {stopped} removed")
        st = run.st
        if st.phase in STOPPING:
            return

    # Failed: wait for a spec change (generation) or a new retry annotation value.
    if st.phase == "Failed":
        if target == st.stable:
            run.set(phase="Idle", failureReason=None, failureMessage=None, failedVersion=None)
            run.event("Normal", "PromotionCleared", f"spec.promote names the stable version {target} again")
            return
        if not run.restart_failed(target):
            return
        st = run.st

    # Idle / Cooling: start a promotion when spec.promote names another version.
    if st.phase in ("Idle", "Cooling") and target != st.stable:
        if st.stable is not None and st.previous == target and run.obs(target).ready:
            warm_switch(run, target)
            return
        if st.phase == "Cooling" and st.previous is not None:
            run.event("Normal", "PreviousStopped", f"{st.previous} stopped early: promoting {target} instead")
            run.set(previous=None, coolingUntil=None)
        run.set(phase="Idle")
        run.start(target, "spec.promote changed")
        st = run.st

    if st.phase == "Cooling":
        until = parse_time(st.coolingUntil)
        if until is None or run.now >= until:
            prev = st.previous
            run.set(phase="Idle", previous=None, coolingUntil=None)
            run.event("Normal", "PreviousStopped", f"Rollback window over: {prev} stopped")
        return

    if st.phase in IN_PROGRESS:
        progress(run)


def first_deployment(run: Run) -> None:
    """A reconcile before any version is stable: deploy spec.promote's version; it is promoted once ready."""
    inp = run.inp
    target = inp.spec.version
    if target not in inp.versions:
        return
    st = run.st
    if st.phase in STOPPING:
        if not run.obs(st.candidate).exists or st.candidate in inp.pinned:
            run.set(phase="Failed" if st.phase == "RollingBack" else "Idle", candidate=None)
        return
    if st.phase == "Failed":
        if not run.restart_failed(target):
            return
    elif st.candidate != target or st.phase not in IN_PROGRESS:
        run.set(phase="Idle", candidate=None)
        run.start(target, "first deployment", announce=False)
    progress(run)


def warm_switch(run: Run, target: str) -> None:
    """Re-promote the still-warm previous version: no redeploy, no canary; it was stable minutes ago."""
    old = run.st.stable
    run.set(startedAt=format_time(run.now), candidate=target, **run.requested())
    run.record(target, "Succeeded", "WarmSwitch", old)
    run.make_stable(
        target,
        old,
        lastAnalysis=None,
        failureReason=None,
        failureMessage=None,
        failedVersion=None,
        retryToken=run.inp.retry_annotation or run.st.retryToken,
        abortToken=run.inp.abort_annotation or run.st.abortToken,
    )
    run.event("Normal", "Promoted", f"{target} was still warm: switched 100% of traffic to it at once from {old}")


def progress(run: Run) -> None:
    """A promotion in progress: follow spec.promote, stop if it must, else the step its phase waits for."""
    cand = _follow_target(run)
    if cand is None or _stopped(run, cand):
        return
    st, spec = run.st, run.inp.spec
    if st.phase in ("Deploying", "Waiting"):
        _loading(run, cand)
    elif st.phase == "Paused" and run.inp.hold is not None:
        return  # approved or not, it takes all traffic only once the hold clears
    elif st.phase == "Paused":
        if spec.approval != "Required":
            run.event("Normal", "Approved", f"approval is no longer required: promoting {cand}")
            run.promote()
        else:
            _take_approval(run, cand)
    elif st.phase == "Shadowing":
        if uses_shadow(spec):
            take_analysis(run)
        else:  # the spec dropped the shadow phase: go on as it now says
            after_shadow(run)
    elif spec.strategy != "Canary" or st.step >= len(spec.steps):
        # Progressing beyond the steps the spec now has (or no longer a Canary): the candidate takes over when ready.
        if run.obs(cand).ready:
            finish(run)
    else:
        take_analysis(run)


def _follow_target(run: Run) -> str | None:
    """The version to go on promoting: spec.promote naming the stable version again aborts the promotion (None);
    naming another one supersedes it with a promotion of that one."""
    st, target = run.st, run.inp.spec.version
    cand = st.candidate
    assert cand is not None
    if target == st.stable:
        run.record(cand, "Aborted", ABORTED, st.stable)
        run.set(phase="Aborted", weight=0, step=-1)
        run.event("Normal", ABORTED, f"spec.promote names {target} again: promotion of {cand} aborted")
        return None
    if target != cand:
        run.record(cand, "Aborted", SUPERSEDED, st.stable)
        run.event("Normal", ABORTED, f"Promotion of {cand} superseded by {target}")
        run.start(target, f"spec.promote changed from {cand}")
    return target


def _stopped(run: Run, cand: str) -> bool:
    """Whether the promotion was rolled back now: aborted by annotation, invalid artifacts, a failed candidate, or
    past its progress deadline."""
    abort = run.inp.abort_annotation
    if abort and abort != run.st.abortToken:
        run.set(abortToken=abort)
        run.fail(ABORTED, f"aborted by the {ABORT_ANNOTATION} annotation ({abort})")
        return True
    o = run.obs(cand)
    if o.artifacts_valid is False:
        run.fail(ARTIFACTS_INVALID, f"artifacts of {cand} are invalid: {o.message or 'see ArtifactsValid'}")
        return True
    if o.failed:
        run.fail(CANDIDATE_FAILED, f"{cand} failed: {o.message or 'InferenceService reports a failure'}")
        return True
    deadline = run.deadline()
    # A candidate that became ready while loading goes on, even if that took until the deadline.
    loaded = run.st.phase in ("Deploying", "Waiting") and o.ready
    if deadline is not None and run.now >= deadline and not loaded:
        run.fail(DEADLINE_EXCEEDED, deadline_message(run, cand))
        return True
    return False


def _loading(run: Run, cand: str) -> None:
    """Deploying or Waiting: once the candidate is ready, the first phase of its strategy begins."""
    st, spec, o = run.st, run.inp.spec, run.obs(cand)
    if o.artifacts_valid is None:
        run.set(phase="Deploying")
        return
    if not o.ready:
        # Artifacts valid: the candidate's InferenceService is applied in this same reconcile (it is live;
        # a failed apply fails the reconcile before the status is written, and it is retried), so this pass
        # already says Waiting: no status write of its own once the InferenceService shows up.
        if st.phase == "Deploying" and (o.exists or o.artifacts_valid is True):
            run.set(phase="Waiting")
            if st.stable is not None:  # a first deployment's progress is its status, its news one Event
                run.event("Normal", "CandidateDeployed",
                          f"InferenceService of {cand} applied, waiting for it to become ready")
        return
    if run.inp.hold is not None:
        # Warm and ready, but something it needs to serve is not (a required audit bucket): no traffic, no mirror;
        # it goes on by itself once the hold clears. A first version does not serve at all until then.
        run.set(phase="Waiting")
        return
    if st.stable is None:
        run.promote()  # first deployment: nothing to compare with, nothing else serves
    elif uses_shadow(spec):
        enter_shadow(run)
    elif spec.strategy != "Canary" or not spec.steps:
        finish(run)
    else:
        enter_step(run, 0)


def _take_approval(run: Run, cand: str | None) -> bool:
    """Promote `cand` if the approve annotation names it with a value not used before; False: not approved."""
    approval = run.inp.approve_annotation
    if not approves(approval, cand, run.st.approveToken):
        return False
    run.set(approveToken=approval)
    run.event("Normal", "Approved", f"{cand} approved ({APPROVE_ANNOTATION}={approval})")
    run.promote()
    return True


def finish(run: Run) -> None:
    """Every analysis passed: take all traffic, or wait for approval first (a hold keeps the step it is in)."""
    if run.inp.hold is not None:
        return
    if run.inp.spec.approval != "Required":
        run.promote()
        return
    cand = run.st.candidate
    if _take_approval(run, cand):
        return
    keep = run.st.phase == "Progressing" and run.inp.spec.strategy == "Canary"
    run.set(phase="Paused", step=run.st.step if keep else -1, weight=run.st.weight if keep else 0)
    run.event(
        "Normal",
        "WaitingForApproval",
        f"{cand} passed its analysis and waits for approval: kubectl arbiter approve (sets {APPROVE_ANNOTATION}="
        f"{cand})",
    )


def enter_shadow(run: Run) -> None:
    """The stable version starts mirroring a sample of its requests to the candidate."""
    sh = run.inp.spec.shadow or DEFAULT_SHADOW
    run.set(phase="Shadowing", step=-1, weight=0, stepStartedAt=format_time(run.now))
    run.event(
        "Normal",
        "ShadowStarted",
        f"{run.st.stable} mirrors {sh.sampleRate * 100:g}% of its requests to {run.st.candidate} "
        f"(no live traffic to it), hold {sh.holdSeconds}s, minAgreement {sh.minAgreement}",
    )


def after_shadow(run: Run) -> None:
    """The shadow phase passed: the canary steps, if any, else finish."""
    spec = run.inp.spec
    if spec.strategy == "Canary" and spec.steps:
        enter_step(run, 0)
    else:
        finish(run)


def enter_step(run: Run, index: int) -> None:
    step = run.inp.spec.steps[index]
    run.set(phase="Progressing", step=index, weight=step.weight, stepStartedAt=format_time(run.now))
    n = len(run.inp.spec.steps)
    run.event(
        "Normal",
        "StepStarted",
        f"Step {index + 1}/{n}: {step.weight}% of traffic to {run.st.candidate}, hold {step.holdSeconds}s",
    )


def take_analysis(run: Run) -> None:
    """Act on this reconcile's analysis of the current step (or shadow phase): a failure rolls back (beyond
    failureLimit), a final pass (or any Sequential pass) moves on, anything else waits."""
    result = run.inp.analysis
    st = run.st
    started = parse_time(st.stepStartedAt)
    if result is None or result.step != st.step or started is None:
        return
    at = parse_time(result.at)
    if at is None or at < started:
        return  # stale: from before this step began
    spec = run.inp.spec
    shadow = st.phase == "Shadowing"
    hold_end = started + timedelta(seconds=hold_seconds(spec, st) or 0)
    run.set(lastAnalysis=result)
    n = len(spec.steps)
    where = "shadow" if shadow else f"step {st.step + 1}/{n}"
    if result.verdict == "Fail":
        failures = st.consecutiveFailures + 1
        if failures <= spec.analysis.failureLimit:
            run.set(consecutiveFailures=failures)
            run.event(
                "Warning",
                "AnalysisFailureTolerated",
                f"{where.capitalize()}: failed analysis {failures} of failureLimit "
                f"{spec.analysis.failureLimit} tolerated: {result.message}",
            )
            return
        reason = SHADOW_FAILED if shadow else ANALYSIS_FAILED
        run.fail(reason, f"{where}: {result.message}")
        return
    if result.verdict == "Pass":
        run.set(consecutiveFailures=0)
    early = result.verdict == "Pass" and result.mode == "Sequential"  # evidence of no regression: the step is done
    if at < hold_end and not early:
        return  # interim analysis: only a failure acts before the hold ends (Sequential: a pass too)
    if result.verdict == "Pass":
        run.event("Normal", "AnalysisPassed", f"{where.capitalize()} passed: {result.message}")
        if shadow:
            after_shadow(run)
        elif st.step + 1 < n:
            enter_step(run, st.step + 1)
        else:
            finish(run)
        return
    if result.verdict in ("NoData", "Pending") and spec.analysis.insufficientTraffic == "Fail":
        reason = SHADOW_FAILED if shadow else ANALYSIS_FAILED
        run.fail(reason, f"{where}: insufficient traffic: {result.message}")
        return
    reason = "AnalysisInconclusive" if result.verdict == "Inconclusive" else "InsufficientTraffic"
    run.event("Warning", reason, f"{where.capitalize()} waits: {result.message}")


def deadline_message(run: Run, cand: str) -> str:
    """What the promotion was waiting on when its progress deadline passed."""
    st, spec = run.st, run.inp.spec
    secs = spec.progressDeadlineSeconds
    if st.phase == "Deploying":
        where = f"InferenceService of {cand} not created" + (
            " (artifacts not validated yet)" if run.obs(cand).artifacts_valid is None else ""
        )
    elif st.phase == "Waiting":
        where = f"{cand} not ready"
    elif st.phase == "Shadowing":
        where = "shadow phase did not pass"
    else:
        where = f"step {st.step + 1}/{len(spec.steps)} did not pass"
    msg = f"{where} within progressDeadlineSeconds={secs}"
    if run.obs(cand).held:
        msg += f"; held by {run.obs(cand).held}: {run.obs(cand).message}"
    if st.lastAnalysis is not None and st.phase in ("Progressing", "Shadowing"):
        msg += f"; last analysis {st.lastAnalysis.verdict}: {st.lastAnalysis.message}"
    return msg
