"""One call of `advance` at work: the status it builds, the Events it says, and the moves every transition is made
of (start, fail, promote, record an outcome), each keeping status, history and Events in step.

Pure: `now` comes with the inputs. The transitions (promotion.transitions) and the normalisation of a status read back
(promotion.normalise) act only through `Run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from arbiter_operator.api.conditions import Event as PromotionEvent
from arbiter_operator.api.names import RETRY_ANNOTATION
from arbiter_operator.api.promotion import PromotionRecord, PromotionStatus
from arbiter_operator.api.times import format_time, parse_time
from arbiter_operator.promotion.history import append_record
from arbiter_operator.promotion.model import ABORTED, PromotionInputs, VersionObservation
from arbiter_operator.promotion.schedule import hold_seconds


def whole_seconds_between(start: datetime, end: datetime) -> int:
    return max(0, int((end - start).total_seconds()))


@dataclass
class Run:
    """The promotion status of this reconcile as it is being decided, and the Events that say what changed."""

    inp: PromotionInputs
    now: datetime
    st: PromotionStatus
    events: list[PromotionEvent] = field(default_factory=list)

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
            requestedBy=self.st.requestedBy,
            revision=self.st.requestedRevision,
            generation=self.st.requestedGeneration,
        )
        self.set(history=append_record(self.st.history, rec))

    def requested(self) -> dict[str, object]:
        """Who asked for the promotion starting now, for its status and, when it ends, its history record."""
        req = self.inp.request
        return {"requestedBy": req.by if req else None, "requestedRevision": req.revision if req else None,
                "requestedGeneration": self.inp.generation}

    def start(self, version: str, why: str, announce: bool = True) -> None:
        """Begin promoting `version` (Deploying). Annotation values seen now are consumed, so only a later change
        to either annotation can retry or abort this promotion. announce=False: no PromotionStarted Event (a first
        deployment says it all in one Event once it serves, or in its failure's Warning)."""
        self.set(
            **self.requested(),
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
            hold = hold_seconds(spec, self.st)
            if step_start is not None and hold is not None:
                base = step_start + timedelta(seconds=hold)
        return None if base is None else base + timedelta(seconds=spec.progressDeadlineSeconds)
