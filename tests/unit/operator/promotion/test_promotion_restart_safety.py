"""Restart safety as properties: whatever status a (restarted) operator reads back, and whatever happens next,
there is never more than one stable version, never an untracked candidate, never traffic to nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from arbiter_operator.api.promotion import (
    Analysis,
    AnalysisRun,
    CanaryStep,
    PromoteSpec,
    PromotionStatus,
    Shadow,
)
from arbiter_operator.promotion import PromotionInputs, PromotionPlan, VersionObservation, advance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VERSIONS = ("v1", "v2", "v3")
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

version = st.sampled_from(VERSIONS)
maybe_version = st.none() | version
times = st.none() | st.integers(-4000, 4000).map(
    lambda s: (T0 + timedelta(seconds=s)).isoformat().replace("+00:00", "Z")
)
phases = st.sampled_from(
    ["Idle", "Deploying", "Waiting", "Shadowing", "Progressing", "Paused", "Promoted", "Cooling", "RollingBack",
     "Failed", "Aborted"]
)
observation = st.builds(
    VersionObservation,
    exists=st.booleans(),
    ready=st.booleans(),
    failed=st.booleans(),
    artifacts_valid=st.sampled_from([True, True, True, None, False]),
)
analysis = st.none() | st.builds(
    AnalysisRun,
    at=times.filter(lambda t: t is not None),
    step=st.integers(-1, 3),
    verdict=st.sampled_from(["Pass", "Fail", "NoData", "Inconclusive"]),
    requests=st.none() | st.floats(0, 1e4),
    p95LatencyMs=st.none() | st.floats(0, 1e4),
    errorRate=st.none() | st.floats(0, 1),
)
status = st.none() | st.builds(
    PromotionStatus,
    phase=phases,
    stable=maybe_version,
    candidate=maybe_version,
    previous=maybe_version,
    step=st.integers(-1, 4),
    weight=st.integers(0, 100),
    startedAt=times,
    stepStartedAt=times,
    coolingUntil=times,
    lastAnalysis=analysis,
    failureReason=st.none() | st.sampled_from(["AnalysisFailed", "CandidateFailed"]),
    failedVersion=maybe_version,
    failedGeneration=st.none() | st.integers(1, 3),
    retryToken=st.none() | st.sampled_from(["a", "b"]),
    approveToken=st.none() | st.sampled_from(["v2", "v2@a"]),
    consecutiveFailures=st.integers(0, 3),
)
spec = st.builds(
    PromoteSpec,
    version=version,
    strategy=st.sampled_from(["Immediate", "Canary", "Shadow"]),
    steps=st.sampled_from(
        [[], [CanaryStep(weight=10, holdSeconds=30)], [CanaryStep(weight=10, holdSeconds=30), CanaryStep(weight=60)]]
    ),
    progressDeadlineSeconds=st.sampled_from([30, 600]),
    rollbackWindowSeconds=st.sampled_from([0, 300]),
    analysis=st.builds(Analysis, insufficientTraffic=st.sampled_from(["Wait", "Fail"]),
                       failureLimit=st.sampled_from([0, 1])),
    shadow=st.none() | st.builds(Shadow, holdSeconds=st.sampled_from([0, 30])),
    approval=st.sampled_from(["Auto", "Required"]),
)


def check(plan: PromotionPlan, observations: dict[str, VersionObservation]) -> None:
    s = plan.status
    PromotionStatus.model_validate(s.model_dump())  # what is written back is valid status
    named = [v for v in (s.stable, s.candidate, s.previous) if v is not None]
    assert len(named) == len(set(named)), f"one version in two roles: {s}"
    assert plan.live <= set(named), f"live {plan.live} beyond stable/candidate/previous {named}"
    if s.stable is not None:
        assert s.stable in plan.live, "the stable version is always kept"
    if s.phase in ("Failed", "Idle"):
        assert s.candidate is None
    if s.phase != "Cooling":
        assert s.previous is None
    if plan.traffic:
        assert sum(plan.traffic.values()) == 100
        assert all(w > 0 for w in plan.traffic.values())
        for v in plan.traffic:
            assert v in plan.live and observations.get(v, VersionObservation()).ready, f"traffic to {v} not ready"
    else:
        assert not any(observations.get(v, VersionObservation()).ready for v in plan.live), "traffic to nothing"
    if s.phase == "Progressing" and plan.traffic.get(s.candidate, 0) not in (0, 100):
        assert plan.traffic[s.candidate] == s.weight
    if s.phase == "Shadowing" and s.stable is not None and observations.get(s.stable, VersionObservation()).ready:
        assert s.candidate not in plan.traffic, "a shadowed candidate answers no caller"
    if plan.shadow is not None:
        assert s.phase == "Shadowing" and {plan.shadow.stable, plan.shadow.candidate} <= plan.live
        assert (plan.shadow.stable, plan.shadow.candidate) == (s.stable, s.candidate)
    assert plan.requeue_after is None or plan.requeue_after > 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=spec,
    status=status,
    observations=st.fixed_dictionaries({v: observation for v in VERSIONS}),
    run=analysis,
    retry=st.none() | st.sampled_from(["a", "b"]),
    generation=st.integers(1, 3),
    offset=st.integers(0, 5000),
)
def test_any_status_read_back_gives_a_safe_plan(spec, status, observations, run, retry, generation, offset):
    plan = advance(
        PromotionInputs(
            spec, status, VERSIONS, observations, 150.0, run, retry, generation, T0 + timedelta(seconds=offset)
        )
    )
    check(plan, observations)


# One history of events; the operator may be "restarted" between any two (it keeps nothing but status anyway).
event = st.one_of(
    st.tuples(st.just("time"), st.integers(1, 400)),
    st.tuples(st.just("promote"), version),
    st.tuples(st.just("ready"), version, st.booleans()),
    st.tuples(st.just("crash"), version),
    st.tuples(st.just("analysis"), st.sampled_from(["Pass", "Fail", "NoData", "Inconclusive"])),
    st.tuples(st.just("retry"), st.sampled_from(["r1", "r2", "r3"])),
    st.tuples(st.just("abort"), st.sampled_from(["x1", "x2"])),
    st.tuples(st.just("approve"), st.sampled_from(["v2", "v3@1", "v1@2"])),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=spec, events=st.lists(event, max_size=40))
def test_every_history_of_events_stays_safe(first, events):
    cur_spec, status, now, gen = first, None, T0, 1
    retry = abort = approve = None
    obs: dict[str, VersionObservation] = {}
    for ev in [*events, ("time", 1)]:
        run = None
        kind = ev[0]
        if kind == "time":
            now += timedelta(seconds=ev[1])
        elif kind == "promote":
            cur_spec, gen = cur_spec.model_copy(update={"version": ev[1]}), gen + 1
        elif kind == "ready" and obs.get(ev[1], VersionObservation()).exists:
            obs[ev[1]] = VersionObservation(exists=True, ready=ev[2])
        elif kind == "crash" and obs.get(ev[1], VersionObservation()).exists:
            obs[ev[1]] = VersionObservation(exists=True, failed=True, message="crash")
        elif kind == "analysis" and status is not None and status.phase in ("Progressing", "Shadowing"):
            run = AnalysisRun(at=now.isoformat().replace("+00:00", "Z"), step=status.step, verdict=ev[1])
        elif kind == "retry":
            retry = ev[1]
        elif kind == "abort":
            abort = ev[1]
        elif kind == "approve":
            approve = ev[1]
        plan = advance(PromotionInputs(cur_spec, status, VERSIONS, dict(obs), 150.0, run, retry, gen, now, abort,
                                       approve))
        check(plan, obs)
        status = plan.status
        # What apply does: exactly the live versions have an InferenceService.
        for v in list(obs):
            if v not in plan.live:
                obs.pop(v)
        for v in plan.live:
            obs.setdefault(v, VersionObservation(exists=True))
