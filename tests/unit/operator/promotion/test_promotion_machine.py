"""The promotion state machine on plain data: every transition a user can cause or suffer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from arbiter_operator.api.promotion import Analysis, AnalysisRun, CanaryStep, PromoteSpec, PromotionStatus
from arbiter_operator.promotion import (
    PromotionInputs,
    PromotionPlan,
    VersionObservation,
    advance,
    analysis_due,
    judge,
)
from hypothesis import given
from hypothesis import strategies as st
from support.plannerdrive import same_mix

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
READY = VersionObservation(exists=True, ready=True)
CREATED = VersionObservation(exists=True, ready=False)
GONE = VersionObservation()


def canary(version: str = "v2", **kw) -> PromoteSpec:
    base = dict(
        version=version,
        strategy="Canary",
        steps=[CanaryStep(weight=10, holdSeconds=60), CanaryStep(weight=50, holdSeconds=60)],
        progressDeadlineSeconds=600,
        rollbackWindowSeconds=300,
        analysis=Analysis(intervalSeconds=30, p95LatencyMs=None, maxErrorRate=0.01, minRequests=50),
    )
    base.update(kw)
    return PromoteSpec(**base)


@dataclass
class Sim:
    """One DecisionModel as the operator sees it across reconciles; status is carried over like the apiserver does."""

    spec: PromoteSpec
    versions: tuple[str, ...] = ("v1", "v2", "v3")
    obs: dict[str, VersionObservation] = field(default_factory=dict)
    status: PromotionStatus | None = None
    now: datetime = T0
    generation: int = 1
    retry: str | None = None
    abort: str | None = None
    sla: float | None = 150.0
    plan: PromotionPlan | None = None

    def tick(self, analysis: AnalysisRun | None = None, after: float = 0) -> PromotionPlan:
        self.now += timedelta(seconds=after)
        self.plan = advance(
            PromotionInputs(
                spec=self.spec,
                status=self.status,
                versions=self.versions,
                observations=dict(self.obs),
                candidate_sla_p95_ms=self.sla,
                analysis=analysis,
                retry_annotation=self.retry,
                generation=self.generation,
                now=self.now,
                abort_annotation=self.abort,
            )
        )
        self.status = self.plan.status
        # The apply layer: ISVCs exist exactly for live versions (created ones start not ready).
        for v in list(self.obs):
            if v not in self.plan.live:
                self.obs[v] = GONE
        for v in self.plan.live:
            if not self.obs.get(v, GONE).exists:
                self.obs[v] = CREATED
        return self.plan

    def analyse(self, p95_s: float, errors: float, requests: float) -> AnalysisRun | None:
        q = analysis_due(self.spec, self.status, self.now, namespace="ns", model="m", sla_p95_ms=self.sla)
        if q is None:
            return None
        return judge(q, {"requests": requests, "errors": errors, "decision_p95": p95_s, "vllm_p95": None,
                         **same_mix(requests - errors)})

    def measured(self, after: float, p95_s: float = 0.08, errors: float = 0, requests: float = 500) -> PromotionPlan:
        """Let `after` seconds pass, run the analysis if one is due (with these numbers), then reconcile."""
        self.now += timedelta(seconds=after)
        return self.tick(self.analyse(p95_s, errors, requests))

    def stable_on(self, version: str) -> None:
        """Bring `version` up as the first stable version."""
        self.spec = self.spec.model_copy(update={"version": version})
        self.tick()
        self.obs[version] = READY
        plan = self.tick(after=5)
        assert plan.status.phase == "Idle" and plan.status.stable == version


def reasons(plan: PromotionPlan) -> list[str]:
    return [e.reason for e in plan.events]


def good(sim: Sim) -> AnalysisRun | None:
    return sim.analyse(p95_s=0.08, errors=0, requests=500)


def run_to_step(sim: Sim, index: int) -> None:
    """From Idle on v1: start promoting sim.spec.version and walk passing analyses up to canary step `index`."""
    sim.tick()
    sim.obs[sim.spec.version] = READY
    plan = sim.tick(after=2)
    assert plan.status.phase == "Progressing" and plan.status.step == 0
    while sim.status.step < index:
        sim.measured(60)
    assert sim.status.step == index


# --- first deployment ------------------------------------------------------------------------------------------------


def test_first_deployment_deploys_waits_then_serves_everything():
    sim = Sim(spec=canary("v1"))
    plan = sim.tick()
    # Artifacts valid: the InferenceService is applied in this very pass, which already says Waiting (one status
    # write fewer than Deploying, then Waiting once it shows up).
    assert plan.status.phase == "Waiting" and plan.live == {"v1"}
    assert plan.traffic == {}  # nothing is ready: no traffic anywhere rather than traffic to nothing
    assert plan.ready.status == "False" and plan.promoted.reason == "Progressing"
    plan = sim.tick(after=1)
    assert plan.status.phase == "Waiting"
    sim.obs["v1"] = READY
    plan = sim.tick(after=10)
    # No stable version yet, so there is nothing to canary against: 100% at once, even for Canary.
    assert plan.status.phase == "Idle" and plan.status.stable == "v1" and plan.status.candidate is None
    assert plan.traffic == {"v1": 100} and plan.live == {"v1"}
    assert plan.ready.status == "True" and plan.promoted.status == "True" and plan.stalled.status == "False"
    assert plan.status.history[-1].outcome == "Succeeded" and plan.status.history[-1].fromVersion is None


def test_first_deployment_candidate_crash_is_stalled_and_retried_by_spec_change():
    sim = Sim(spec=canary("v1"))
    sim.tick()
    sim.obs["v1"] = VersionObservation(exists=True, failed=True, message="CrashLoopBackOff")
    plan = sim.tick(after=5)
    assert plan.status.phase == "RollingBack" and plan.live == frozenset()
    plan = sim.tick(after=1)
    assert plan.status.phase == "Failed" and plan.stalled.status == "True"
    assert plan.stalled.reason == "CandidateFailed" and "CrashLoopBackOff" in plan.stalled.message
    assert sim.tick(after=60).status.phase == "Failed"  # not retried by itself
    sim.generation = 2
    assert sim.tick(after=1).status.phase == "Waiting"  # deploying again (artifacts valid: applied at once)


def test_artifacts_not_checked_yet_keep_the_gpu_free():
    sim = Sim(spec=canary("v1"), obs={"v1": VersionObservation(artifacts_valid=None)})
    plan = sim.tick()
    assert plan.status.phase == "Deploying" and plan.live == frozenset()


# --- canary ----------------------------------------------------------------------------------------------------------


def test_clean_canary_walks_every_step_to_100_then_cools_down():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    plan = sim.tick(after=10)
    assert plan.status.phase == "Waiting" and plan.live == {"v1", "v2"} and plan.traffic == {"v1": 100}
    assert reasons(plan) == ["PromotionStarted", "CandidateDeployed"]
    plan = sim.tick(after=1)
    assert plan.status.phase == "Waiting" and plan.traffic == {"v1": 100}  # never to a backend that is not ready
    assert plan.promoted.status == "False" and plan.reconciling.status == "True" and plan.ready.status == "False"
    sim.obs["v2"] = READY
    plan = sim.tick(after=30)
    assert plan.status.phase == "Progressing" and plan.status.step == 0
    assert plan.traffic == {"v1": 90, "v2": 10}
    # Within the hold: the interim analysis passes, but only the final one advances the step.
    assert sim.analyse(0.08, 0, 500) is None  # not due before an interval has passed
    plan = sim.measured(30)
    assert plan.status.step == 0 and plan.status.lastAnalysis.verdict == "Pass"
    plan = sim.measured(30)
    assert plan.status.step == 1 and plan.traffic == {"v1": 50, "v2": 50}
    assert "AnalysisPassed" in reasons(plan) and "StepStarted" in reasons(plan)
    plan = sim.measured(60)
    assert plan.status.phase == "Cooling" and plan.status.stable == "v2" and plan.status.previous == "v1"
    assert plan.traffic == {"v2": 100} and plan.live == {"v1", "v2"}  # previous stays warm
    assert plan.promoted.status == "True" and plan.ready.status == "True" and plan.stalled.status == "False"
    rec = plan.status.history[-1]
    assert (rec.version, rec.fromVersion, rec.outcome) == ("v2", "v1", "Succeeded")
    assert rec.durationSeconds == pytest.approx(151)  # started 1+30+30+30+60 s ago
    assert 0 < plan.requeue_after <= 301  # woken for the end of the rollback window
    plan = sim.tick(after=300)
    assert plan.status.phase == "Idle" and plan.live == {"v2"} and plan.status.previous is None
    assert "PreviousStopped" in reasons(plan)


def test_immediate_switches_once_ready_without_analysis():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2", strategy="Immediate")
    sim.tick()
    plan = sim.tick(after=1)
    assert plan.traffic == {"v1": 100}
    sim.obs["v2"] = READY
    plan = sim.tick(after=1)
    assert plan.status.phase == "Cooling" and plan.traffic == {"v2": 100}


def test_latency_breach_at_second_step_rolls_back_at_once_with_numbers():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 1)
    assert sim.plan.traffic == {"v1": 50, "v2": 50}
    # An interim analysis during the hold sees the breach: no need to wait for the end of the hold.
    assert sim.analyse(p95_s=0.400, errors=0, requests=800) is None  # the first interval has not passed yet
    sim.now += timedelta(seconds=30)
    run = sim.analyse(p95_s=0.400, errors=0, requests=800)
    assert run.verdict == "Fail"
    plan = sim.tick(run)
    assert plan.status.phase == "RollingBack" and plan.traffic == {"v1": 100} and plan.live == {"v1"}
    assert plan.status.failureReason == "AnalysisFailed"
    assert plan.status.lastAnalysis.p95LatencyMs == pytest.approx(400) and plan.status.lastAnalysis.p95BoundMs == 150
    for cond in (plan.promoted, plan.stalled):
        assert cond.reason == "AnalysisFailed" and "400.0ms" in cond.message and "150.0ms" in cond.message
    assert plan.stalled.status == "True" and plan.promoted.status == "False" and plan.ready.status == "False"
    assert plan.events[-1].type == "Warning" and "step 2/2" in plan.events[-1].message
    plan = sim.tick(after=1)
    assert plan.status.phase == "Failed" and plan.status.candidate is None and plan.status.failedVersion == "v2"
    assert plan.status.stable == "v1" and plan.traffic == {"v1": 100}
    assert plan.status.history[-1].outcome == "RolledBack"
    # Not retried by itself, however long we wait.
    for _ in range(3):
        plan = sim.tick(after=600)
        assert plan.status.phase == "Failed" and plan.live == {"v1"}


def test_error_rate_breach_rolls_back():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.now += timedelta(seconds=30)
    run = sim.analyse(p95_s=0.05, errors=30, requests=600)
    assert run.verdict == "Fail" and run.errorRate == pytest.approx(0.05)
    plan = sim.tick(run)
    assert plan.status.failureReason == "AnalysisFailed" and "error rate" in plan.status.failureMessage
    assert plan.traffic == {"v1": 100}


def test_default_latency_bound_is_the_candidate_sla():
    sim = Sim(spec=canary("v1"), sla=100.0)
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.now += timedelta(seconds=30)
    assert sim.analyse(p95_s=0.120, errors=0, requests=500).verdict == "Fail"
    sim.spec = canary("v2", analysis=Analysis(intervalSeconds=30, p95LatencyMs=200, minRequests=50))
    assert sim.analyse(p95_s=0.120, errors=0, requests=500).verdict == "Pass"


def test_too_little_traffic_waits_then_hits_the_deadline():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.now += timedelta(seconds=60)
    run = sim.analyse(p95_s=0.05, errors=0, requests=3)
    assert run.verdict == "NoData"
    plan = sim.tick(run)
    assert plan.status.phase == "Progressing" and plan.status.step == 0 and plan.traffic == {"v1": 90, "v2": 10}
    assert "InsufficientTraffic" in reasons(plan)
    # Asked again every interval; still waiting.
    assert sim.analyse(0.05, 0, 3) is None
    plan = sim.measured(30, 0.05, 0, 3)
    assert plan.status.phase == "Progressing" and plan.status.lastAnalysis.verdict == "NoData"
    # Deadline counts from the end of the hold: 600 s later the step is given up.
    plan = sim.tick(after=600)
    assert plan.status.phase == "RollingBack" and plan.status.failureReason == "ProgressDeadlineExceeded"
    assert "minRequests=50" in plan.stalled.message and plan.traffic == {"v1": 100}


def test_too_little_traffic_fails_when_asked_to():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2", analysis=Analysis(intervalSeconds=30, minRequests=50, insufficientTraffic="Fail"))
    run_to_step(sim, 0)
    sim.now += timedelta(seconds=30)
    plan = sim.tick(sim.analyse(0.05, 0, 3))  # interim: too early to judge traffic
    assert plan.status.phase == "Progressing"
    sim.now += timedelta(seconds=30)
    plan = sim.tick(sim.analyse(0.05, 0, 3))
    assert plan.status.failureReason == "AnalysisFailed" and "insufficient traffic" in plan.status.failureMessage


def test_empty_prometheus_result_is_no_data_not_a_pass():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.now += timedelta(seconds=60)
    q = analysis_due(sim.spec, sim.status, sim.now, namespace="ns", model="m", sla_p95_ms=150)
    run = judge(q, {"requests": None, "errors": None, "decision_p95": None, "vllm_p95": None})
    assert run.verdict == "NoData"
    run2 = judge(q, {"requests": 500.0, "errors": None, "decision_p95": float("nan"), "vllm_p95": None})
    assert run2.verdict == "NoData"
    run3 = judge(q, {}, error="connection refused")
    assert run3.verdict == "Inconclusive"
    for r in (run, run2, run3):
        assert sim.tick(r).status.step == 0
        sim.now += timedelta(seconds=30)


def test_progress_deadline_when_candidate_never_becomes_ready():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2", progressDeadlineSeconds=120)
    sim.tick()
    plan = sim.tick(after=119)
    assert plan.status.phase == "Waiting"
    plan = sim.tick(after=1)
    assert plan.status.failureReason == "ProgressDeadlineExceeded" and "v2 not ready" in plan.status.failureMessage
    assert plan.traffic == {"v1": 100} and plan.live == {"v1"}


def test_candidate_crash_during_canary_rolls_back():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.obs["v2"] = VersionObservation(exists=True, ready=False, failed=True, message="OOMKilled")
    plan = sim.tick(after=5)
    assert plan.status.failureReason == "CandidateFailed" and "OOMKilled" in plan.promoted.message
    assert plan.traffic == {"v1": 100}


def test_candidate_not_ready_mid_canary_gets_no_traffic():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.obs["v2"] = CREATED
    plan = sim.tick(after=5)
    assert plan.status.phase == "Progressing" and plan.traffic == {"v1": 100}
    assert plan.requeue_after <= 2


def test_abort_by_pointing_spec_back_at_stable():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 1)
    sim.spec = canary("v1")
    sim.generation += 1
    plan = sim.tick(after=1)
    assert plan.status.phase == "Aborted" and plan.traffic == {"v1": 100} and plan.live == {"v1"}
    assert plan.promoted.status == "True" and plan.promoted.reason == "Aborted" and plan.ready.status == "True"
    assert plan.status.history[-1].outcome == "Aborted"
    plan = sim.tick(after=1)
    assert plan.status.phase == "Idle" and plan.status.candidate is None


def test_abort_annotation_rolls_back_without_touching_spec():
    sim = Sim(spec=canary("v1"), abort="old-value")
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)  # a value present when the promotion starts does not abort it
    assert sim.status.phase == "Progressing"
    sim.abort = "2026-03-01T12:05:00Z"
    plan = sim.tick(after=1)
    assert plan.status.phase == "RollingBack" and plan.status.failureReason == "Aborted"
    assert plan.stalled.status == "True" and plan.promoted.reason == "Aborted" and plan.traffic == {"v1": 100}


def test_retry_annotation_restarts_a_failed_promotion_once_per_value():
    sim = Sim(spec=canary("v1"), retry="r0")
    sim.stable_on("v1")
    sim.spec = canary("v2", progressDeadlineSeconds=60)
    sim.tick()
    sim.tick(after=60)
    sim.tick(after=1)
    assert sim.status.phase == "Failed"
    assert sim.tick(after=30).status.phase == "Failed"  # the old value does not retry
    sim.retry = "r1"
    plan = sim.tick(after=1)
    assert plan.status.phase == "Waiting" and plan.status.retryToken == "r1" and plan.live == {"v1", "v2"}
    sim.tick(after=60)
    assert sim.tick(after=1).status.phase == "Failed"
    assert sim.tick(after=1).status.phase == "Failed"  # r1 was consumed


def test_spec_change_restarts_a_failed_promotion_and_reverting_clears_it():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2", progressDeadlineSeconds=60)
    sim.tick()
    sim.tick(after=60)
    sim.tick(after=1)
    assert sim.status.phase == "Failed"
    sim.generation = 2
    assert sim.tick(after=1).status.phase == "Waiting"
    sim.tick(after=60)
    sim.tick(after=1)
    sim.spec = canary("v1")
    sim.generation = 3
    plan = sim.tick(after=1)
    assert plan.status.phase == "Idle" and plan.ready.status == "True" and plan.stalled.status == "False"


def test_repromoting_the_warm_previous_version_is_instant():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 1)
    sim.measured(60)
    assert sim.status.phase == "Cooling" and sim.plan.live == {"v1", "v2"}
    sim.spec = canary("v1")
    plan = sim.tick(after=10)
    # No Deploying, no Waiting, no canary: straight to 100% on the warm version; v2 now stays warm in turn.
    assert plan.status.phase == "Cooling" and plan.status.stable == "v1" and plan.status.previous == "v2"
    assert plan.traffic == {"v1": 100} and plan.live == {"v1", "v2"}
    assert plan.status.history[-1].reason == "WarmSwitch"


def test_new_promotion_during_cooling_stops_the_previous_version():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2", strategy="Immediate")
    sim.tick()
    sim.obs["v2"] = READY
    sim.tick(after=1)
    assert sim.status.phase == "Cooling"
    sim.spec = canary("v3")
    plan = sim.tick(after=1)
    assert plan.status.phase == "Waiting" and plan.live == {"v2", "v3"} and plan.status.previous is None


def test_switching_target_mid_canary_supersedes_the_candidate():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.spec = canary("v3")
    plan = sim.tick(after=1)
    assert plan.status.candidate == "v3" and plan.live == {"v1", "v3"} and plan.traffic == {"v1": 100}
    assert plan.status.history[-1].reason == "Superseded"


def test_unknown_version_changes_nothing_that_serves():
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v9")
    plan = sim.tick(after=1)
    assert plan.traffic == {"v1": 100} and plan.live == {"v1"}
    assert plan.stalled.status == "True" and plan.stalled.reason == "UnknownVersion"


def test_history_is_bounded():
    sim = Sim(spec=canary("v1", rollbackWindowSeconds=0))
    sim.stable_on("v1")
    for _ in range(14):
        target = "v2" if sim.status.stable == "v1" else "v1"
        sim.spec = canary(target, strategy="Immediate", rollbackWindowSeconds=0)
        sim.tick(after=1)
        sim.obs[target] = READY
        sim.tick(after=1)
        assert sim.status.stable == target
    assert len(sim.status.history) == 10


def test_restart_resumes_each_phase_from_status_alone():
    """A new operator sees only status and the cluster: feeding the status back reproduces the same plan."""
    sim = Sim(spec=canary("v1"))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    seen = []
    for _ in range(12):
        before = sim.status
        obs = dict(sim.obs)
        plan = sim.measured(20)
        seen.append(plan.status.phase)
        again = advance(
            PromotionInputs(sim.spec, plan.status, sim.versions, obs, 150.0, None, None, 1, sim.now)
        )
        assert again.traffic == plan.traffic or plan.status.phase in ("Deploying", "Waiting")
        assert again.status.stable == plan.status.stable
        if sim.status.phase == "Waiting":
            sim.obs["v2"] = READY
        del before
    assert {"Waiting", "Progressing", "Cooling"} <= set(seen)


def test_analysis_window_never_reaches_back_before_the_step_started():
    # A retried candidate keeps its metric series: samples from the failed attempt must not judge the new one.
    spec = PromoteSpec(version="v2", strategy="Canary", steps=[CanaryStep(weight=10, holdSeconds=3)],
                       analysis=Analysis(intervalSeconds=60))
    started = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
    status = PromotionStatus(phase="Progressing", stable="v1", candidate="v2", step=0, weight=10,
                             stepStartedAt="2026-11-30T04:00:00Z")
    # stepStartedAt is truncated to the second: the step may have begun as late as 04:00:00.999, when the failed
    # attempt's last samples were still arriving, so the window covers only the whole seconds after that.
    q = analysis_due(spec, status, started + timedelta(seconds=3), namespace="ns", model="m", sla_p95_ms=150)
    assert q is not None and q.final and q.window_seconds == 2
    assert all("[2s]" in expr for expr in q.queries.values())
    assert q.at - timedelta(seconds=q.window_seconds) >= started + timedelta(seconds=1)
    later = analysis_due(spec, status, started + timedelta(seconds=600), namespace="ns", model="m", sla_p95_ms=150)
    assert later is not None and later.window_seconds == 60


@given(st.floats(min_value=-10, max_value=10**6, allow_nan=False))
def test_loading_safety_requeue_is_every_ten_minutes(elapsed):
    from arbiter_operator.api.backoff import LOADING_POLL
    from arbiter_operator.promotion.outcome import POLL_MAX_SECONDS, loading_poll

    poll = loading_poll(elapsed)
    assert LOADING_POLL.first == 600 and POLL_MAX_SECONDS == 600
    assert poll == 600  # a safety net: the watches wake a loading version, however long it has been loading


def test_a_loading_version_is_not_polled_but_its_deadline_is_kept():
    """The watches wake a loading version's DecisionModel; the plan's own requeue is a slow safety net, never later
    than the progress deadline (which needs a timer: nothing changes when a version just never loads)."""
    sim = Sim(spec=canary("v1"))
    sim.obs["v1"] = CREATED
    early = sim.tick(after=1)
    assert early.status.phase in ("Deploying", "Waiting") and early.requeue_after == 600
    late = sim.tick(after=120)
    assert late.status.phase in ("Deploying", "Waiting")
    deadline = sim.spec.progressDeadlineSeconds
    # The safety net, or just after the deadline when that comes first.
    assert 0 <= late.requeue_after - min(600, deadline - 121) <= 2
    near = sim.tick(after=deadline - 121 - 10)  # 10 s before the deadline: woken just after it
    assert near.status.phase in ("Deploying", "Waiting") and 10 <= near.requeue_after <= 12
