"""The analysis clock: when the current canary step's (or shadow phase's) next analysis falls due, and the window
it reads (pure; `now` is passed in).

During a step's hold an analysis runs every `intervalSeconds` so a breach rolls back early; the analysis at the end
of the hold decides whether the step passes. In the Sequential mode the evidence is looked at every
`sequential.lookSeconds` over everything since the step began, and a look may pass the step before its hold (the
longest it holds) ends. The state machine wakes for these times (its requeue), and `analysis.analysis_due` asks
whether one has come.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from arbiter_operator.api.promotion import AnalysisRun, PromoteSpec, PromotionStatus
from arbiter_operator.api.times import parse_time
from arbiter_operator.promotion.bounds import DEFAULT_SHADOW


def whole_seconds(now: datetime) -> datetime:
    """Status times have whole seconds; comparing against truncated `now` keeps step boundaries exact."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).replace(microsecond=0)


def hold_seconds(spec: PromoteSpec, status: PromotionStatus) -> int | None:
    """How long the current step (or shadow phase) holds; None outside one."""
    if status.phase == "Shadowing":
        return (spec.shadow or DEFAULT_SHADOW).holdSeconds
    if status.phase == "Progressing" and 0 <= status.step < len(spec.steps):
        return spec.steps[status.step].holdSeconds
    return None


def cadence_seconds(spec: PromoteSpec) -> int:
    """How often a step (or shadow phase) is analysed: every interval (Windowed), every look (Sequential)."""
    a = spec.analysis
    return a.sequential_settings().lookSeconds if a.mode == "Sequential" else a.intervalSeconds


def _last_for_step(status: PromotionStatus) -> AnalysisRun | None:
    last = status.lastAnalysis
    started = parse_time(status.stepStartedAt)
    if last is None or started is None or last.step != status.step:
        return None
    at = parse_time(last.at)
    return last if at is not None and at >= started else None


def next_analysis_at(spec: PromoteSpec, status: PromotionStatus | None) -> tuple[datetime, bool] | None:
    """When the current canary step's (or shadow phase's) next analysis falls due, and whether it is the final one."""
    if status is None or status.candidate is None:
        return None
    if status.phase == "Progressing" and spec.strategy != "Canary":
        return None
    if status.phase == "Shadowing" and status.stable is None:
        return None
    hold = hold_seconds(spec, status)
    started = parse_time(status.stepStartedAt)
    if hold is None or started is None:
        return None
    interval = timedelta(seconds=cadence_seconds(spec))
    hold_end = started + timedelta(seconds=hold)
    last = _last_for_step(status)
    last_at = parse_time(last.at) if last else None
    if last_at is not None and last_at >= hold_end:
        # The final analysis ran and did not pass (NoData with Wait, or Inconclusive): ask again an interval later.
        return last_at + interval, True
    interim = (last_at or started) + interval
    if interim < hold_end:
        return interim, False
    return hold_end, True


def analysis_window(spec: PromoteSpec, status: PromotionStatus, now: datetime, shadow: bool) -> tuple[int, bool]:
    """The analysis window in seconds, and whether this analysis is the step's final one."""
    step_started = parse_time(status.stepStartedAt)
    assert step_started is not None
    # A late interim analysis (the operator woke after the hold ended) is the final one: label it by the clock.
    final = now >= step_started + timedelta(seconds=hold_seconds(spec, status) or 0)
    # The window never reaches back before the step started: samples from the previous step, or from a failed attempt
    # of the same version before a retry (same series, still in Prometheus), must not judge this step.
    # stepStartedAt has whole seconds (truncated), so the step began up to a second after it: one second less keeps
    # a retry started within the second its previous attempt failed from being judged on that attempt's last samples.
    elapsed = int((now - step_started).total_seconds()) - 1
    # The shadow phase and the Sequential mode read everything since the step began.
    whole = shadow or spec.analysis.mode == "Sequential"
    return max(1, elapsed if whole else min(spec.analysis.intervalSeconds, elapsed)), final
