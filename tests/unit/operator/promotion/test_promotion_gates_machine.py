"""The promotion state machine with the gates SREs expect: failureLimit, manual approval, and the shadow phase
(champion/challenger) -- every transition on plain data, `now` passed in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from arbiter_operator.api.promotion import Analysis, PromotionStatus, Shadow
from arbiter_operator.promotion import PromotionInputs, advance, analysis_due, judge
from support.plannerdrive import same_mix
from test_promotion_machine import CREATED, GONE, READY, Sim, canary


@dataclass
class GateSim(Sim):
    approve: str | None = None

    def tick(self, analysis=None, after: float = 0):
        self.now += timedelta(seconds=after)
        self.plan = advance(
            PromotionInputs(
                spec=self.spec, status=self.status, versions=self.versions, observations=dict(self.obs),
                candidate_sla_p95_ms=self.sla, analysis=analysis, retry_annotation=self.retry,
                generation=self.generation, now=self.now, abort_annotation=self.abort,
                approve_annotation=self.approve,
            )
        )
        self.status = self.plan.status
        for v in list(self.obs):
            if v not in self.plan.live:
                self.obs[v] = GONE
        for v in self.plan.live:
            if not self.obs.get(v, GONE).exists:
                self.obs[v] = CREATED
        return self.plan

    def shadow_analysis(self, agree: float, disagree: float, requests: float = 500):
        q = analysis_due(self.spec, self.status, self.now, namespace="ns", model="m", sla_p95_ms=self.sla)
        if q is None:
            return None
        return judge(q, {"requests": requests, "errors": 0, "decision_p95": 0.08,
                         "shadow_agree": {"true": agree, "false": disagree}, **same_mix(requests),
                         "shadow_confusion": {"approve->decline": disagree} if disagree else {}})

    def shadowed(self, after: float, agree: float, disagree: float):
        self.now += timedelta(seconds=after)
        return self.tick(self.shadow_analysis(agree, disagree))


def started(sim: GateSim) -> None:
    """v1 stable; spec.promote names v2, which becomes ready."""
    sim.stable_on("v1")
    sim.spec = sim.spec.model_copy(update={"version": "v2"})
    sim.tick()
    sim.obs["v2"] = READY
    sim.tick(after=2)


# --- failureLimit --------------------------------------------------------------------------------------------------


def test_failure_limit_tolerates_failed_analyses_in_a_row_then_rolls_back():
    spec = canary("v1", analysis=Analysis(intervalSeconds=30, minRequests=50, failureLimit=2))
    sim = GateSim(spec)
    started(sim)
    assert sim.status.phase == "Progressing"
    plan = sim.measured(30, p95_s=0.4)  # interim analysis fails: 1 of 2 tolerated
    assert plan.status.phase == "Progressing" and plan.status.consecutiveFailures == 1
    assert "AnalysisFailureTolerated" in [e.reason for e in plan.events] and plan.traffic == {"v1": 90, "v2": 10}
    plan = sim.measured(30, p95_s=0.08)  # a pass resets the count and ends step 1
    assert plan.status.consecutiveFailures == 0 and plan.status.step == 1
    sim.measured(30, p95_s=0.4)
    sim.measured(30, p95_s=0.4)
    assert sim.status.phase == "Progressing" and sim.status.consecutiveFailures == 2
    plan = sim.measured(30, p95_s=0.4)  # third in a row: over the limit
    assert plan.status.phase == "RollingBack" and plan.status.failureReason == "AnalysisFailed"
    assert plan.traffic == {"v1": 100}


def test_failure_limit_zero_rolls_back_on_the_first_failure():
    sim = GateSim(canary("v1"))
    started(sim)
    assert sim.measured(30, p95_s=0.4).status.phase == "RollingBack"


# --- manual approval -------------------------------------------------------------------------------------------------


def test_approval_pauses_at_the_last_step_until_the_annotation_names_the_candidate():
    sim = GateSim(canary("v1", approval="Required"), approve="v2@old")  # a value from before: not an approval
    started(sim)
    sim.measured(60)
    plan = sim.measured(60)
    assert plan.status.phase == "Paused" and plan.status.weight == 50 and plan.traffic == {"v1": 50, "v2": 50}
    assert plan.reconciling.status == "True" and plan.reconciling.reason == "WaitingForApproval"
    assert "kubectl arbiter approve" in plan.promoted.message
    assert "WaitingForApproval" in [e.reason for e in plan.events]
    # No deadline while a person decides; no analysis is asked for.
    plan = sim.tick(after=3 * 86400)
    assert plan.status.phase == "Paused" and plan.requeue_after is None
    sim.approve = "v3@later"  # names another version
    assert sim.tick(after=1).status.phase == "Paused"
    sim.approve = "v2@2026-03-04T12:00:00Z"
    plan = sim.tick(after=1)
    assert plan.status.phase == "Cooling" and plan.status.stable == "v2" and plan.traffic == {"v2": 100}
    assert "Approved" in [e.reason for e in plan.events]


def test_abort_while_paused_rolls_back():
    sim = GateSim(canary("v1", approval="Required"))
    started(sim)
    sim.measured(60)
    sim.measured(60)
    assert sim.status.phase == "Paused"
    sim.abort = "now"
    plan = sim.tick(after=1)
    assert plan.status.phase == "RollingBack" and plan.traffic == {"v1": 100}


def test_immediate_with_approval_waits_at_zero_traffic():
    sim = GateSim(canary("v1", strategy="Immediate", approval="Required"))
    started(sim)
    assert sim.status.phase == "Paused" and sim.plan.traffic == {"v1": 100} and "v2" in sim.plan.live
    sim.approve = "v2"
    assert sim.tick(after=1).status.stable == "v2"


def test_approval_after_a_restart_from_status_alone():
    sim = GateSim(canary("v1", approval="Required"))
    started(sim)
    sim.measured(60)
    sim.measured(60)
    saved = PromotionStatus.model_validate(sim.status.model_dump())
    sim.status = saved
    sim.approve = "v2@x"
    assert sim.tick(after=1).status.phase == "Cooling"


# --- shadow (champion/challenger) ------------------------------------------------------------------------------------


def shadow_spec(**kw) -> object:
    return canary("v1", strategy="Shadow",
                  shadow=Shadow(holdSeconds=120, minAgreement=0.95, minCompared=100, sampleRate=0.2), **kw)


def test_shadow_mirrors_without_live_traffic_then_promotes_an_agreeing_candidate():
    sim = GateSim(shadow_spec())
    started(sim)
    plan = sim.plan
    assert plan.status.phase == "Shadowing" and plan.traffic == {"v1": 100} and {"v1", "v2"} <= plan.live
    assert plan.shadow is not None and (plan.shadow.stable, plan.shadow.candidate, plan.shadow.sample_rate) == (
        "v1", "v2", 0.2)
    assert "ShadowStarted" in [e.reason for e in plan.events]
    plan = sim.shadowed(30, agree=20, disagree=0)  # interim, too few comparisons: waits
    assert plan.status.phase == "Shadowing" and plan.status.lastAnalysis.verdict == "NoData"
    plan = sim.shadowed(90, agree=298, disagree=2)  # end of hold: 99.3% agreement
    assert plan.status.phase == "Cooling" and plan.status.stable == "v2" and plan.shadow is None
    assert plan.traffic == {"v2": 100}


def test_a_disagreeing_shadow_candidate_is_rolled_back_naming_agreement_and_bound():
    sim = GateSim(shadow_spec())
    started(sim)
    plan = sim.shadowed(30, agree=160, disagree=40)
    assert plan.status.phase == "RollingBack" and plan.status.failureReason == "ShadowAnalysisFailed"
    assert plan.shadow is None and plan.traffic == {"v1": 100}
    assert "shadow agreement 80.00% below min 95.00%" in plan.stalled.message
    assert plan.stalled.reason == "ShadowAnalysisFailed"


def test_shadow_then_canary_steps():
    spec = canary("v1", shadow=Shadow(holdSeconds=60, minCompared=10))
    sim = GateSim(spec)
    started(sim)
    assert sim.status.phase == "Shadowing"
    plan = sim.shadowed(60, agree=100, disagree=0)
    assert plan.status.phase == "Progressing" and plan.status.step == 0 and plan.traffic == {"v1": 90, "v2": 10}
    assert plan.shadow is None


def test_shadow_without_comparisons_hits_the_progress_deadline():
    sim = GateSim(shadow_spec(progressDeadlineSeconds=60))
    started(sim)
    sim.shadowed(120, agree=0, disagree=0)
    assert sim.status.phase == "Shadowing"
    plan = sim.shadowed(61, agree=0, disagree=0)
    assert plan.status.phase == "RollingBack" and plan.status.failureReason == "ProgressDeadlineExceeded"
    assert "shadow phase did not pass" in plan.stalled.message and "waiting for shadow data" in plan.stalled.message


def test_shadow_with_approval_pauses_at_zero_traffic():
    sim = GateSim(shadow_spec(approval="Required"))
    started(sim)
    plan = sim.shadowed(120, agree=300, disagree=0)
    assert plan.status.phase == "Paused" and plan.traffic == {"v1": 100} and plan.shadow is None
