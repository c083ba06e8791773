"""The promotion state machine: (spec.promote, status.promotion, observations, analysis) -> next status and plan.

Pure: no I/O, no clock (the caller passes `now`). Every reconcile calls `advance` once; the result depends only on its
inputs, so a restarted operator that reads status back resumes where the last one stopped. The invariants the tests
check for any input (including arbitrary, inconsistent status):
- one stable version at most; candidate, stable and previous are distinct;
- `live` (the versions whose InferenceService must exist) holds only stable, candidate and previous;
- `traffic` names only live, ready versions and sums to 100, and is empty only when no live version is ready.
See docs/operations.md ("Promotion") for the user-facing semantics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from arbiter_operator.api.backoff import LOADING_POLL
from arbiter_operator.api.conditions import PROMOTED, RECONCILING, STALLED, Condition, make_condition
from arbiter_operator.api.conditions import Event as PromotionEvent  # one Event type for planner and machine
from arbiter_operator.api.names import ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION
from arbiter_operator.api.promotion import (
    IN_PROGRESS,
    STOPPING,
    AnalysisRun,
    PromoteSpec,
    PromotionRecord,
    PromotionStatus,
    approves,
)
from arbiter_operator.api.times import format_time, parse_time
from arbiter_operator.promotion.analysis import (
    DEFAULT_SHADOW,
    _hold_seconds,
    next_analysis_at,
    whole_seconds,
)
from arbiter_operator.promotion.history import HISTORY_LIMIT as HISTORY_LIMIT  # re-exported
from arbiter_operator.promotion.history import SUPERSEDED, append_record

# While waiting on something that has no timer (a candidate being deleted, a candidate turning ready during a canary),
# poll at this pace; the operator's watch on its children usually wakes it sooner.
POLL_SECONDS = 2.0
# While a version loads (Deploying, Waiting), the requeue is a safety net, 60 s backing off to 5 min with the time
# spent loading (api/backoff.py LOADING_POLL): KServe's status, the predictor Deployment and its pods are watched and
# wake the operator the moment the version is ready or in trouble. (A 2-15 s poll here cost most of the reconcile
# passes of a fleet rolling out.)
POLL_MAX_SECONDS = LOADING_POLL.cap


def whole_seconds_between(start: datetime, end: datetime) -> int:
    return max(0, int((end - start).total_seconds()))


def loading_poll(elapsed: float) -> float:
    """Seconds until the next look at a version that has been loading for `elapsed` seconds: backing off with the
    time spent loading (api/backoff.LOADING_POLL). Loading a large model takes minutes, and KServe's status change
    wakes the operator through its watch the moment the version is ready: the poll is a safety net, and at a fixed
    2 s it cost most of the reconcile passes of a fleet rolling out."""
    return LOADING_POLL.delay(elapsed)


# Failure reasons (status.promotion.failureReason, and the reason of Promoted/Stalled/Ready).
ANALYSIS_FAILED = "AnalysisFailed"
SHADOW_FAILED = "ShadowAnalysisFailed"
DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
CANDIDATE_FAILED = "CandidateFailed"
ARTIFACTS_INVALID = "ArtifactsInvalid"
ABORTED = "Aborted"
UNKNOWN_VERSION = "UnknownVersion"


@dataclass(frozen=True)
class VersionObservation:
    """What the observe layer saw of one version's InferenceService."""

    exists: bool = False
    ready: bool = False
    failed: bool = False  # KServe reports a terminal failure (e.g. crash loop, image pull, OOM)
    message: str = ""
    # A transient cause (plan/signals.py: a webhook unreachable, the apiserver timing out, a full quota) the version
    # waits on: its reason. Never a failure; the progress deadline bounds the wait.
    held: str = ""
    artifacts_valid: bool | None = True  # None: not checked yet; the ISVC is not created before it is known valid


@dataclass(frozen=True)
class PromotionInputs:
    spec: PromoteSpec
    status: PromotionStatus | None
    versions: tuple[str, ...]  # spec.versions[].name
    observations: Mapping[str, VersionObservation]
    candidate_sla_p95_ms: float | None  # SLA of spec.promote.version (default p95 bound)
    analysis: AnalysisRun | None  # the result of analysis_due's query, when one ran for this reconcile
    retry_annotation: str | None
    generation: int
    now: datetime
    abort_annotation: str | None = None
    approve_annotation: str | None = None


@dataclass(frozen=True)
class ShadowPlan:
    """The stable version mirrors a sample of its traffic to the candidate (rendered as the stable's shadow.json)."""

    stable: str
    candidate: str
    sample_rate: float
    timeout_ms: int
    max_in_flight: int


def uses_shadow(spec: PromoteSpec) -> bool:
    """Strategy Shadow, or a Canary with a shadow phase before its first step."""
    return spec.strategy == "Shadow" or (spec.strategy == "Canary" and spec.shadow is not None)


@dataclass(frozen=True)
class ReadyVerdict:
    """What the Ready condition should say as far as promotion is concerned (the planner may add other reasons)."""

    status: Literal["True", "False"]
    reason: str
    message: str


@dataclass(frozen=True)
class PromotionPlan:
    status: PromotionStatus
    live: frozenset[str]
    traffic: Mapping[str, int]
    promoted: Condition
    stalled: Condition
    reconciling: Condition
    ready: ReadyVerdict
    events: tuple[PromotionEvent, ...]
    requeue_after: float | None
    shadow: ShadowPlan | None = None


@dataclass
class _Run:
    inp: PromotionInputs
    now: datetime
    st: PromotionStatus
    events: list[PromotionEvent] = field(default_factory=list)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def obs(self, version: str | None) -> VersionObservation:
        if version is None:
            return VersionObservation()
        return self.inp.observations.get(version, VersionObservation())

    def set(self, **changes: object) -> None:
        self.st = self.st.model_copy(update=changes)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(PromotionEvent(type_, reason, message))

    def record(self, version: str, outcome: str, reason: str, from_version: str | None) -> None:
        started = parse_time(self.st.startedAt) or self.now
        rec = PromotionRecord(
            version=version,
            fromVersion=from_version,
            outcome=outcome,
            reason=reason,
            startedAt=format_time(started),
            finishedAt=format_time(self.now),
            durationSeconds=max(0.0, (self.now - started).total_seconds()),
        )
        self.set(history=append_record(self.st.history, rec))

    def start(self, version: str, why: str, announce: bool = True) -> None:
        """Begin promoting `version` (Deploying). Annotation values seen now are consumed, so only a later change
        to either annotation can retry or abort this promotion. announce=False: no PromotionStarted Event (a first
        deployment says it all in one Event once it serves, or in its failure's Warning)."""
        self.set(
            phase="Deploying",
            candidate=version,
            step=-1,
            weight=0,
            startedAt=format_time(self.now),
            stepStartedAt=None,
            lastAnalysis=None,
            failureReason=None,
            failureMessage=None,
            failedVersion=None,
            failedGeneration=None,
            retryToken=self.inp.retry_annotation or self.st.retryToken,
            abortToken=self.inp.abort_annotation or self.st.abortToken,
            approveToken=self.inp.approve_annotation or self.st.approveToken,
            consecutiveFailures=0,
        )
        frm = f" from {self.st.stable}" if self.st.stable else ""
        if announce:
            self.event("Normal", "PromotionStarted", f"Promoting {version}{frm} ({self.inp.spec.strategy}); {why}")

    def restart_failed(self, target: str) -> bool:
        """A Failed promotion starts again on a spec change (a new generation) or a new retry annotation value;
        False: neither happened, it stays Failed."""
        inp, st = self.inp, self.st
        retry = inp.retry_annotation
        if inp.generation != st.failedGeneration:
            self.start(target, f"spec changed (generation {inp.generation})")
        elif retry and retry != st.retryToken:
            self.set(retryToken=retry)
            self.start(target, f"retry requested ({RETRY_ANNOTATION}={retry})")
        else:
            return False
        return True

    def fail(self, reason: str, message: str) -> None:
        """Traffic back to stable at once (traffic is derived from the new phase), candidate stopped."""
        cand = self.st.candidate
        assert cand is not None
        self.record(cand, "Aborted" if reason == ABORTED else "RolledBack", reason, self.st.stable)
        self.set(
            phase="RollingBack",
            weight=0,
            failureReason=reason,
            failureMessage=message,
            failedVersion=cand,
            failedGeneration=self.inp.generation,
        )
        back = f"traffic back on {self.st.stable}" if self.st.stable else "nothing was serving yet"
        self.event("Warning", reason, f"Promotion of {cand} rolled back ({back}): {message}")

    def promote(self) -> None:
        cand = self.st.candidate
        assert cand is not None
        old = self.st.stable
        started = parse_time(self.st.startedAt)
        self.record(cand, "Succeeded", "Promoted", old)
        keep = self.make_stable(cand, old, stepStartedAt=None)
        msg = f"{cand} is stable and receives 100% of traffic"
        if old is None and started is not None:  # the first deployment's one Event (planner: posted as Ready)
            msg += f" (first deployment, serving {whole_seconds_between(started, self.now)} s after it started)"
        if keep:
            msg += f"; {old} stays warm for rollback until {self.st.coolingUntil}"
        self.event("Normal", "Promoted", msg)

    def make_stable(self, version: str, old: str | None, **extra: object) -> bool:
        """`version` takes 100% and becomes stable; `old` stays warm (Cooling) for the rollback window, if any.
        Returns whether `old` is kept warm."""
        window = self.inp.spec.rollbackWindowSeconds
        keep = old is not None and window > 0
        self.set(
            phase="Cooling" if keep else "Idle",
            stable=version,
            candidate=None,
            previous=old if keep else None,
            coolingUntil=format_time(self.now + timedelta(seconds=window)) if keep else None,
            step=-1,
            weight=0,
            **extra,
        )
        return keep

    def deadline(self) -> datetime | None:
        """Deadline for the current wait: progress must happen within progressDeadlineSeconds of entering the
        phase or step, beyond the holds the spec itself asks for (so long canaries are not cut short)."""
        spec = self.inp.spec
        if self.st.phase == "Paused":
            return None  # a person decides; abort is always available
        base = parse_time(self.st.startedAt)
        if self.st.phase in ("Progressing", "Shadowing"):
            step_start = parse_time(self.st.stepStartedAt)
            hold = _hold_seconds(spec, self.st)
            if step_start is not None and hold is not None:
                base = step_start + timedelta(seconds=hold)
        return None if base is None else base + timedelta(seconds=spec.progressDeadlineSeconds)

    # -- normalisation: any status read back (even one edited by hand) becomes a consistent one ----------------
    def normalise(self) -> None:
        st = self.st
        if st.candidate is not None and st.candidate == st.stable:
            self.set(candidate=None)
        if self.st.previous is not None and (
            self.st.stable is None or self.st.previous in (self.st.stable, self.st.candidate)
        ):
            self.set(previous=None)
        phase = self.st.phase
        if phase in IN_PROGRESS + STOPPING and self.st.candidate is None:
            phase = "Failed" if phase == "RollingBack" else "Idle"
        if phase == "Failed":
            self.set(candidate=None)  # a failed candidate is never kept: it is not live, so it gets stopped
            if self.st.failedVersion is None:
                phase = "Idle"
        if phase in ("Idle", "Cooling", "Promoted") and self.st.candidate is not None:
            # A candidate recorded outside a promotion phase: resume its promotion from the start (it stays warm).
            phase = "Deploying"
            if self.st.startedAt is None:
                self.set(startedAt=format_time(self.now))
        if phase == "Promoted":
            phase = "Cooling" if self.st.previous else "Idle"
        if phase == "Cooling" and (self.st.previous is None or parse_time(self.st.coolingUntil) is None):
            phase = "Idle"
        if phase != "Cooling" and self.st.previous is not None:
            self.set(previous=None, coolingUntil=None)
        if phase == "Progressing" and (self.st.step < 0 or parse_time(self.st.stepStartedAt) is None):
            phase = "Waiting"
        if phase == "Shadowing" and (self.st.stable is None or parse_time(self.st.stepStartedAt) is None):
            phase = "Waiting"
        if phase == "Paused" and self.st.stable is None:
            phase = "Waiting"
        if phase == "Shadowing":
            self.set(step=-1)
        if phase in ("Deploying", "Waiting") and parse_time(self.st.startedAt) is None:
            self.set(startedAt=format_time(self.now))
        if phase in ("Deploying", "Waiting"):
            self.set(step=-1, weight=0)
        self.set(phase=phase)
        if phase == "Progressing":
            steps = self.inp.spec.steps
            # Weight follows the spec's step; a step index beyond a shortened spec keeps a canary-sized weight.
            w = steps[self.st.step].weight if self.st.step < len(steps) else max(1, min(99, self.st.weight or 50))
            self.set(weight=w)
        elif phase == "Paused":
            # Paused after the last canary step keeps that step's weight; after a shadow phase or Immediate, none.
            steps = self.inp.spec.steps
            canary = self.inp.spec.strategy == "Canary" and 0 <= self.st.step < len(steps)
            self.set(weight=steps[self.st.step].weight if canary else 0, step=self.st.step if canary else -1)
        else:
            self.set(weight=0)

    # -- the transitions -------------------------------------------------------------------------------------------
    def step_machine(self) -> None:
        inp, spec = self.inp, self.inp.spec
        target = spec.version
        if target not in inp.versions:
            return  # UnknownVersion: keep serving whatever serves; conditions say why
        st = self.st

        # Stopping a rolled-back or aborted candidate: done once its InferenceService is gone.
        if st.phase in STOPPING:
            if not self.obs(st.candidate).exists:
                stopped = st.candidate
                self.set(phase="Failed" if st.phase == "RollingBack" else "Idle", candidate=None)
                self.event("Normal", "CandidateStopped", f"InferenceService of {stopped} removed")
            st = self.st
            if st.phase in STOPPING:
                return

        # Failed: wait for a spec change (generation) or a new retry annotation value.
        if st.phase == "Failed":
            if target == st.stable:
                self.set(phase="Idle", failureReason=None, failureMessage=None, failedVersion=None)
                self.event("Normal", "PromotionCleared", f"spec.promote names the stable version {target} again")
                return
            if not self.restart_failed(target):
                return
            st = self.st

        # Idle / Cooling: start a promotion when spec.promote names another version.
        if st.phase in ("Idle", "Cooling") and target != st.stable:
            if st.stable is not None and st.previous == target and self.obs(target).ready:
                self.warm_switch(target)
                return
            if st.phase == "Cooling" and st.previous is not None:
                self.event("Normal", "PreviousStopped", f"{st.previous} stopped early: promoting {target} instead")
                self.set(previous=None, coolingUntil=None)
            self.set(phase="Idle")
            self.start(target, "spec.promote changed")
            st = self.st

        if st.phase == "Cooling":
            until = parse_time(st.coolingUntil)
            if until is None or self.now >= until:
                prev = st.previous
                self.set(phase="Idle", previous=None, coolingUntil=None)
                self.event("Normal", "PreviousStopped", f"Rollback window over: {prev} stopped")
            return

        if st.phase in IN_PROGRESS:
            self.progress()

    def warm_switch(self, target: str) -> None:
        """Re-promote the still-warm previous version: no redeploy, no canary; it was stable minutes ago."""
        old = self.st.stable
        self.set(startedAt=format_time(self.now), candidate=target)
        self.record(target, "Succeeded", "WarmSwitch", old)
        self.make_stable(
            target,
            old,
            lastAnalysis=None,
            failureReason=None,
            failureMessage=None,
            failedVersion=None,
            retryToken=self.inp.retry_annotation or self.st.retryToken,
            abortToken=self.inp.abort_annotation or self.st.abortToken,
        )
        self.event("Normal", "Promoted", f"{target} was still warm: switched 100% of traffic to it at once from {old}")

    def progress(self) -> None:
        inp, spec, st = self.inp, self.inp.spec, self.st
        target = spec.version
        cand = st.candidate
        assert cand is not None
        if target == st.stable:
            self.record(cand, "Aborted", ABORTED, st.stable)
            self.set(phase="Aborted", weight=0, step=-1)
            self.event("Normal", ABORTED, f"spec.promote names {target} again: promotion of {cand} aborted")
            return
        if target != cand:
            self.record(cand, "Aborted", SUPERSEDED, st.stable)
            self.event("Normal", ABORTED, f"Promotion of {cand} superseded by {target}")
            self.start(target, f"spec.promote changed from {cand}")
            cand = target
        abort = inp.abort_annotation
        if abort and abort != self.st.abortToken:
            self.set(abortToken=abort)
            self.fail(ABORTED, f"aborted by the {ABORT_ANNOTATION} annotation ({abort})")
            return
        o = self.obs(cand)
        if o.artifacts_valid is False:
            self.fail(ARTIFACTS_INVALID, f"artifacts of {cand} are invalid: {o.message or 'see ArtifactsValid'}")
            return
        if o.failed:
            self.fail(CANDIDATE_FAILED, f"{cand} failed: {o.message or 'InferenceService reports a failure'}")
            return
        deadline = self.deadline()
        loaded = self.st.phase in ("Deploying", "Waiting") and o.ready
        if deadline is not None and self.now >= deadline and not loaded:
            self.fail(DEADLINE_EXCEEDED, self.deadline_message(cand))
            return
        st = self.st
        if st.phase in ("Deploying", "Waiting"):
            if o.artifacts_valid is None:
                self.set(phase="Deploying")
                return
            if not o.ready:
                # Artifacts valid: the candidate's InferenceService is applied in this same reconcile (it is live;
                # a failed apply fails the reconcile before the status is written, and it is retried), so this pass
                # already says Waiting: no status write of its own once the InferenceService shows up.
                if st.phase == "Deploying" and (o.exists or o.artifacts_valid is True):
                    self.set(phase="Waiting")
                    if st.stable is not None:  # a first deployment's progress is its status, its news one Event
                        self.event("Normal", "CandidateDeployed",
                                   f"InferenceService of {cand} applied, waiting for it to become ready")
                return
            if st.stable is None:
                self.promote()  # first deployment: nothing to compare with, nothing else serves
                return
            if uses_shadow(spec):
                self.enter_shadow()
                return
            if spec.strategy != "Canary" or not spec.steps:
                self.finish()
                return
            self.enter_step(0)
            return
        if st.phase == "Paused":
            if spec.approval != "Required":
                self.event("Normal", "Approved", f"approval is no longer required: promoting {cand}")
                self.promote()
            elif approves(inp.approve_annotation, cand, st.approveToken):
                self.set(approveToken=inp.approve_annotation)
                self.event("Normal", "Approved", f"{cand} approved ({APPROVE_ANNOTATION}={inp.approve_annotation})")
                self.promote()
            return
        if st.phase == "Shadowing":
            if not uses_shadow(spec):  # the spec dropped the shadow phase: go on as it now says
                self.after_shadow()
                return
            self.take_analysis()
            return
        # Progressing
        if spec.strategy != "Canary" or st.step >= len(spec.steps):
            if o.ready:
                self.finish()
            return
        self.take_analysis()

    def finish(self) -> None:
        """Every analysis passed: take all traffic, or wait for approval first."""
        if self.inp.spec.approval != "Required":
            self.promote()
            return
        cand = self.st.candidate
        if approves(self.inp.approve_annotation, cand, self.st.approveToken):
            self.set(approveToken=self.inp.approve_annotation)
            self.event("Normal", "Approved", f"{cand} approved ({APPROVE_ANNOTATION}={self.inp.approve_annotation})")
            self.promote()
            return
        keep = self.st.phase == "Progressing" and self.inp.spec.strategy == "Canary"
        self.set(phase="Paused", step=self.st.step if keep else -1, weight=self.st.weight if keep else 0)
        self.event(
            "Normal",
            "WaitingForApproval",
            f"{cand} passed its analysis and waits for approval: kubectl arbiter approve (sets {APPROVE_ANNOTATION}="
            f"{cand})",
        )

    def enter_shadow(self) -> None:
        sh = self.inp.spec.shadow or DEFAULT_SHADOW
        self.set(phase="Shadowing", step=-1, weight=0, stepStartedAt=format_time(self.now))
        self.event(
            "Normal",
            "ShadowStarted",
            f"{self.st.stable} mirrors {sh.sampleRate * 100:g}% of its requests to {self.st.candidate} "
            f"(no live traffic to it), hold {sh.holdSeconds}s, minAgreement {sh.minAgreement}",
        )

    def after_shadow(self) -> None:
        spec = self.inp.spec
        if spec.strategy == "Canary" and spec.steps:
            self.enter_step(0)
        else:
            self.finish()

    def enter_step(self, index: int) -> None:
        step = self.inp.spec.steps[index]
        self.set(phase="Progressing", step=index, weight=step.weight, stepStartedAt=format_time(self.now))
        n = len(self.inp.spec.steps)
        self.event(
            "Normal",
            "StepStarted",
            f"Step {index + 1}/{n}: {step.weight}% of traffic to {self.st.candidate}, hold {step.holdSeconds}s",
        )

    def take_analysis(self) -> None:
        run = self.inp.analysis
        st = self.st
        started = parse_time(st.stepStartedAt)
        if run is None or run.step != st.step or started is None:
            return
        at = parse_time(run.at)
        if at is None or at < started:
            return  # stale: from before this step began
        spec = self.inp.spec
        shadow = st.phase == "Shadowing"
        hold_end = started + timedelta(seconds=_hold_seconds(spec, st) or 0)
        self.set(lastAnalysis=run)
        n = len(spec.steps)
        where = "shadow" if shadow else f"step {st.step + 1}/{n}"
        if run.verdict == "Fail":
            failures = st.consecutiveFailures + 1
            if failures <= spec.analysis.failureLimit:
                self.set(consecutiveFailures=failures)
                self.event(
                    "Warning",
                    "AnalysisFailureTolerated",
                    f"{where.capitalize()}: failed analysis {failures} of failureLimit "
                    f"{spec.analysis.failureLimit} tolerated: {run.message}",
                )
                return
            reason = SHADOW_FAILED if shadow else ANALYSIS_FAILED
            self.fail(reason, f"{where}: {run.message}")
            return
        if run.verdict == "Pass":
            self.set(consecutiveFailures=0)
        if at < hold_end:
            return  # interim analysis: only a failure acts before the hold ends
        if run.verdict == "Pass":
            self.event("Normal", "AnalysisPassed", f"{where.capitalize()} passed: {run.message}")
            if shadow:
                self.after_shadow()
            elif st.step + 1 < n:
                self.enter_step(st.step + 1)
            else:
                self.finish()
            return
        if run.verdict == "NoData" and spec.analysis.insufficientTraffic == "Fail":
            reason = SHADOW_FAILED if shadow else ANALYSIS_FAILED
            self.fail(reason, f"{where}: insufficient traffic: {run.message}")
            return
        reason = "InsufficientTraffic" if run.verdict == "NoData" else "AnalysisInconclusive"
        self.event("Warning", reason, f"{where.capitalize()} waits: {run.message}")

    def deadline_message(self, cand: str) -> str:
        st, spec = self.st, self.inp.spec
        secs = spec.progressDeadlineSeconds
        if st.phase == "Deploying":
            where = f"InferenceService of {cand} not created" + (
                " (artifacts not validated yet)" if self.obs(cand).artifacts_valid is None else ""
            )
        elif st.phase == "Waiting":
            where = f"{cand} not ready"
        elif st.phase == "Shadowing":
            where = "shadow phase did not pass"
        else:
            where = f"step {st.step + 1}/{len(spec.steps)} did not pass"
        msg = f"{where} within progressDeadlineSeconds={secs}"
        if self.obs(cand).held:
            msg += f"; held by {self.obs(cand).held}: {self.obs(cand).message}"
        if st.lastAnalysis is not None and st.phase in ("Progressing", "Shadowing"):
            msg += f"; last analysis {st.lastAnalysis.verdict}: {st.lastAnalysis.message}"
        return msg

    # -- first deployment: no stable version yet ---------------------------------------------------------------------
    def first_deployment(self) -> None:
        inp = self.inp
        target = inp.spec.version
        if target not in inp.versions:
            return
        st = self.st
        if st.phase in STOPPING:
            if not self.obs(st.candidate).exists:
                self.set(phase="Failed" if st.phase == "RollingBack" else "Idle", candidate=None)
            return
        if st.phase == "Failed":
            if not self.restart_failed(target):
                return
        elif st.candidate != target or st.phase not in IN_PROGRESS:
            self.set(phase="Idle", candidate=None)
            self.start(target, "first deployment", announce=False)
        self.progress()


def _live(st: PromotionStatus, obs: Mapping[str, VersionObservation]) -> frozenset[str]:
    live = set()
    if st.stable:
        live.add(st.stable)
    # A candidate still Deploying whose artifacts are unchecked has nothing live yet.
    unchecked = st.phase == "Deploying" and obs.get(st.candidate or "", VersionObservation()).artifacts_valid is None
    if st.candidate and st.phase in IN_PROGRESS and not unchecked:
        live.add(st.candidate)
    if st.previous and st.phase == "Cooling":
        live.add(st.previous)
    return frozenset(live)


def _traffic(
    st: PromotionStatus, live: frozenset[str], obs: Mapping[str, VersionObservation]
) -> dict[str, int]:
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
    for v in (st.stable, st.previous, st.candidate):
        if ready(v):
            return {v: 100}  # type: ignore[dict-item]
    return {}


def _conditions(run: _Run, traffic: Mapping[str, int]) -> tuple[Condition, Condition, Condition, ReadyVerdict]:
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
        return (
            cond(PROMOTED, "False", reason, msg),
            cond(STALLED, "False", reason, msg),
            cond(RECONCILING, "True", reason, msg),
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


def _in_progress(run: _Run) -> tuple[str, str]:
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
    held = run.obs(st.candidate)
    if held.held:  # an outage outside the candidate: the reason names it, and how long the promotion waits
        reason = held.held
        until = run.deadline()
        msg += (f"; held: {held.message}. This is an outage, not the candidate's failure: the promotion goes on "
                f"by itself once it clears" + (f", and rolls back at {format_time(until)} (progress deadline)"
                                                if until is not None else ""))
    return reason, msg


def _requeue(run: _Run) -> float | None:
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


def advance(inputs: PromotionInputs) -> PromotionPlan:
    """One reconcile of the promotion: the next status, what must run, where traffic goes, and what to say."""
    now = whole_seconds(inputs.now)
    run = _Run(inp=inputs, now=now, st=inputs.status.model_copy(deep=True) if inputs.status else PromotionStatus())
    run.normalise()
    if run.st.stable is None:
        run.first_deployment()
    else:
        run.step_machine()
    obs = inputs.observations
    live = _live(run.st, obs)
    traffic = _traffic(run.st, live, obs)
    promoted, stalled, reconciling, ready = _conditions(run, traffic)
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
        requeue_after=_requeue(run),
        shadow=shadow,
    )
