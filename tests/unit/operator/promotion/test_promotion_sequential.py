"""Sequential analysis as a user sees it in status: each gate judged on everything since its step began against the
stable version; a regression rolls back at the look that shows it, evidence of none passes the step before its hold
ends, and a gate that cannot tell holds the step (never a pass) until the hold is over and its estimate is within
the tolerated regression. Every row says its statistic, the evidence needed and when a verdict should come."""

from __future__ import annotations

import io
import math
import re
from datetime import UTC, datetime, timedelta

import pytest
from arbiter_operator.api.promotion import (
    SEQUENTIAL_FAILURE_LIMIT,
    SEQUENTIAL_NEEDS_MODE,
    Analysis,
    AnalysisRun,
    CanaryStep,
    PromoteSpec,
    PromotionStatus,
    Shadow,
)
from arbiter_operator.cli.printing import print_status
from arbiter_operator.promotion import analysis_due, judge
from arbiter_operator.promotion.analysis import AnalysisQuery
from arbiter_operator.promotion.machine import PromotionInputs, VersionObservation, advance
from arbiter_operator.promotion.schedule import next_analysis_at
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS, MODEL = "risk", "credit"


def spec(steps=((10, 300), (50, 300)), **analysis) -> PromoteSpec:
    return PromoteSpec(
        version="v2", strategy="Canary", steps=[CanaryStep(weight=w, holdSeconds=h) for w, h in steps],
        analysis=Analysis(**{"mode": "Sequential", "minRequests": 50, **analysis}),
    )


def status(step: int = 0, phase: str = "Progressing") -> PromotionStatus:
    return PromotionStatus(phase=phase, stable="v1", candidate="v2", step=step if phase != "Shadowing" else -1,
                           weight=10, stepStartedAt="2026-03-01T12:00:00Z", startedAt="2026-03-01T11:50:00Z")


def query(s: PromoteSpec | None = None, after: float = 30, st: PromotionStatus | None = None) -> AnalysisQuery:
    q = analysis_due(s or spec(), st or status(), T0 + timedelta(seconds=after), namespace=NS, model=MODEL,
                     sla_p95_ms=100)
    assert q is not None
    return q


BUCKETS = ("0.05", "0.1", "0.15", "+Inf")


def version(n: float, *, errors=0.001, fallbacks=0.01, low=0.05, violations=0.001, slow=0.03,
            mix=(0.355, 0.33, 0.315)) -> dict:
    """One version's counts since the step began: n decisions with these shares."""
    cum = [n * 0.6, n * (1 - slow), n * (1 - slow / 3), n]
    return {
        "requests": n, "errors": errors * n, "fallbacks": fallbacks * n, "low_confidence": low * n,
        "schema_violations": violations * n, "fallback_reasons": {"upstream_error": fallbacks * n},
        "labels": dict(zip(("approve", "review", "deny"), (m * n for m in mix), strict=True)),
        "latency_buckets": dict(zip(BUCKETS, cum, strict=True)),
    }


def values(cand: dict, stable: dict, p95: float = 0.09) -> dict:
    out = {k: v for k, v in cand.items() if k != "labels"}
    out["labels"] = cand["labels"]
    out.update({f"stable_{k}": v for k, v in stable.items() if k != "labels"})
    out["stable_labels"] = stable["labels"]
    out["decision_p95"] = p95
    return out


def row(run: AnalysisRun, name: str):
    return next(c for c in run.checks if c.name == name)


def test_a_sequential_step_reads_both_versions_counts_since_it_began_and_looks_every_look_seconds():
    q = query(after=95)
    assert q.window_seconds == 94 and q.sequential is not None and q.sequential.look_seconds == 3
    assert 'arbiter_dev_version="v1"' in q.queries["stable_fallbacks"] and "[94s]" in q.queries["stable_requests"]
    assert "arbiter_decision_latency_seconds_bucket" in q.vectors["latency_buckets"].promql
    assert 'arbiter_dev_version="v1"' in q.vectors["stable_latency_buckets"].promql
    # The next look is lookSeconds after the last one, well before the hold ends.
    st = status().model_copy(update={"lastAnalysis": AnalysisRun(at="2026-03-01T12:01:35Z", step=0,
                                                                 verdict="Pending")})
    assert next_analysis_at(spec(), st) == (T0 + timedelta(seconds=98), False)


def test_a_fallback_regression_fails_at_the_look_that_shows_it_naming_statistic_and_interval():
    run = judge(query(after=10), values(version(500, fallbacks=0.30), version(4500)))
    assert run.verdict == "Fail" and run.mode == "Sequential"
    c = row(run, "fallbackRate")
    assert c.verdict == "Fail" and "fallback rate 30.00% vs stable 1.00%" in c.message
    assert "more than the tolerated +0.50" in c.message
    ev = c.evidence
    assert ev.estimate == pytest.approx(0.29) and ev.lower > 0.01 and ev.decisions == 500
    assert ev.stableDecisions == 4500 and ev.secondsToVerdict == 0
    # Its share of the false-rollback rate: 5% over 2 steps and the 6 gates this step judges (latency, errors,
    # fallbacks, low confidence, schema violations, the decision mix).
    assert ev.alpha == pytest.approx(0.05 / (2 * 6))
    assert "fallback rate 30.00%" in run.message


def test_an_identical_candidate_passes_early_once_every_gate_shows_no_regression():
    run = judge(query(after=100), values(version(400000), version(3600000)))
    assert run.verdict == "Pass", run.message
    assert "before the end of the hold" in run.message
    assert all(c.verdict == "Pass" for c in run.checks)
    assert all(c.evidence.upper <= c.evidence.tolerated for c in run.checks)


def test_before_the_evidence_suffices_a_look_is_pending_and_says_when_a_verdict_should_come():
    run = judge(query(after=20), values(version(1000), version(9000)))
    assert run.verdict == "Pending" and "evidence so far" in run.message
    pending = [c for c in run.checks if c.verdict == "Pending"]
    assert pending
    for c in pending:
        ev = c.evidence
        assert ev.decisionsNeeded is not None and ev.decisionsNeeded > 1000, c
        assert ev.secondsToVerdict == pytest.approx((ev.decisionsNeeded / 1000 - 1) * 19, rel=1e-6)
        assert "a verdict after about" in c.message


def test_at_the_end_of_the_hold_a_gate_within_tolerance_passes_and_one_above_it_within_noise_holds():
    # Too little evidence for "none" either way, but every estimate within the tolerated regression: a pass.
    run = judge(query(after=300), values(version(400), version(3600)))
    assert run.verdict == "Pass" and "at the end of the hold" in run.message, run.message
    # Fallbacks 1.8% against 1%: above the tolerated point, not shown beyond it: holds (NoData: not enough evidence).
    run = judge(query(after=300), values(version(400, fallbacks=0.025), version(3600)))
    c = row(run, "fallbackRate")
    assert c.verdict == "Pending" and "within noise" in c.message
    assert run.verdict == "NoData" and "not enough evidence at the end of the hold" in run.message


def test_too_few_decisions_on_either_side_never_pass_not_even_at_the_end_of_the_hold():
    # A 95% step: the stable version barely serves; the mix (and every comparison) waits for it.
    run = judge(query(after=300), values(version(3000, mix=(0.96, 0.02, 0.02)), version(10)))
    assert run.verdict in ("NoData", "Fail")
    assert all(c.verdict != "Pass" for c in run.checks if c.evidence and c.evidence.stableDecisions == 10)
    run = judge(query(after=300), values(version(3000), version(10)))
    assert run.verdict == "NoData" and "too few decisions yet" in run.message


def test_an_approve_all_candidate_fails_on_the_label_it_moved():
    run = judge(query(after=30), values(version(800, mix=(0.96, 0.02, 0.02)), version(7200)))
    c = row(run, "decisionMixShift")
    assert run.verdict == "Fail" and c.verdict == "Fail"
    assert "on 'approve'" in c.message and "more than the tolerated 3.00%" in c.message
    assert c.value == pytest.approx(0.605) and c.bound == 0.03


def test_slow_decisions_are_counted_at_the_p95_bound_against_the_stable_version():
    run = judge(query(after=30), values(version(2000, slow=0.087), version(18000, slow=0.033)))
    c = row(run, "p95LatencyMs")
    assert c.verdict == "Fail" and "decisions slower than 100ms 8.70% vs stable 3.30%" in c.message
    assert c.bound == 100 and c.value == pytest.approx(90)  # the p95 itself, as the Windowed mode shows it


def test_a_candidate_past_an_absolute_bound_fails_even_when_the_stable_is_as_bad():
    run = judge(query(after=30), values(version(5000, fallbacks=0.2), version(45000, fallbacks=0.2)))
    c = row(run, "fallbackRate")
    assert c.verdict == "Fail" and "above max 5.00%" in c.message


def test_a_shadow_phase_judges_agreement_against_its_floor():
    s = spec(steps=((10, 300),)).model_copy(update={"shadow": Shadow(holdSeconds=300, minCompared=100)})
    q = query(s, after=60, st=status(phase="Shadowing"))
    assert q.sequential is not None and q.sequential.stages == 2
    v = values(version(2000), version(18000))
    run = judge(q, {**v, "shadow_agree": {"true": 300.0, "false": 700.0}})
    assert row(run, "agreement").verdict == "Fail" and "below min 95.00%" in row(run, "agreement").message
    run = judge(q, {**v, "shadow_agree": {"true": 2000.0}})
    assert row(run, "agreement").verdict == "Pass"


def test_no_decision_metrics_is_no_data_and_a_missing_stable_histogram_is_inconclusive():
    run = judge(query(), {})
    assert run.verdict == "NoData" and "no decision metrics" in run.message
    v = values(version(2000), version(18000))
    del v["stable_latency_buckets"]
    run = judge(query(), v)
    assert run.verdict == "Inconclusive" and "p95LatencyMs" in run.message


garbage = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                    st.integers(-10**12, 10**12),
                    st.dictionaries(st.text(max_size=5), st.one_of(st.floats(allow_nan=True), st.none()), max_size=4))
NAMES = ["requests", "errors", "fallbacks", "low_confidence", "schema_violations", "fallback_reasons", "labels",
         "latency_buckets", "decision_p95", "shadow_agree"]


@settings(max_examples=300, deadline=None)
@given(cand=st.dictionaries(st.sampled_from(NAMES), garbage), stable=st.dictionaries(st.sampled_from(NAMES), garbage),
       after=st.sampled_from([5, 150, 300, 400]))
def test_any_prometheus_answer_gives_a_verdict_never_a_crash_and_bad_numbers_never_pass(cand, stable, after):
    v = {**cand, **{f"stable_{k}": x for k, x in stable.items()}}
    run = judge(query(after=after), v)
    assert run.verdict in ("Pass", "Fail", "NoData", "Inconclusive", "Pending") and run.message
    if run.verdict == "Pass":
        assert all(c.verdict == "Pass" for c in run.checks)
    for c in run.checks:
        for x in (c.value, *(vars(c.evidence).values() if c.evidence else ())):
            assert not isinstance(x, float) or math.isfinite(x)
    run.model_dump_json()


# --- the machine acts on a Sequential pass before the hold ends --------------------------------------------------

def inputs(s: PromoteSpec, st: PromotionStatus, run: AnalysisRun | None, after: float) -> PromotionInputs:
    obs = {"v1": VersionObservation(exists=True, ready=True), "v2": VersionObservation(exists=True, ready=True)}
    return PromotionInputs(spec=s, status=st, versions=("v1", "v2"), observations=obs, candidate_sla_p95_ms=100,
                           analysis=run, retry_annotation=None, generation=1, now=T0 + timedelta(seconds=after))


def test_an_early_sequential_pass_moves_to_the_next_step_and_a_pending_look_waits():
    s = spec()
    q = query(s, after=100)
    plan = advance(inputs(s, status(), judge(q, values(version(400000), version(3600000))), 100))
    assert plan.status.step == 1 and plan.status.weight == 50
    assert any(e.reason == "AnalysisPassed" for e in plan.events)
    q = query(s, after=20)
    plan = advance(inputs(s, status(), judge(q, values(version(1000), version(9000))), 20))
    assert plan.status.step == 0 and plan.status.phase == "Progressing" and not plan.events
    assert plan.requeue_after == pytest.approx(3.05)  # the next look


def test_not_enough_evidence_at_the_end_of_the_hold_waits_or_fails_as_insufficient_traffic_says():
    thin = values(version(400, fallbacks=0.025), version(3600))
    for policy, phase in (("Wait", "Progressing"), ("Fail", "RollingBack")):
        s = spec(insufficientTraffic=policy)
        plan = advance(inputs(s, status(), judge(query(s, after=300), thin), 300))
        assert plan.status.phase == phase
        if policy == "Fail":
            assert "insufficient traffic" in plan.status.failureMessage


def test_the_mode_settings_are_refused_where_they_would_mean_nothing():
    with pytest.raises(ValueError, match=r"read only with analysis\.mode: Sequential"):
        Analysis(sequential={"falseRollbackRate": 0.01})
    with pytest.raises(ValueError, match="failureLimit must be 0"):
        Analysis(mode="Sequential", failureLimit=2)
    assert "Sequential" in SEQUENTIAL_NEEDS_MODE and "delay the rollback" in SEQUENTIAL_FAILURE_LIMIT


# --- what `kubectl arbiter status` prints of it ----------------------------------------------------------------------

def status_text(run) -> str:
    obj = {
        "metadata": {"name": "credit", "namespace": "risk", "generation": 1},
        "spec": {"promote": {"version": "v2", "strategy": "Canary", "steps": [{"weight": 10}, {"weight": 50}]}},
        "status": {"observedGeneration": 1, "promotion": {
            "phase": "Progressing", "stable": "v1", "candidate": "v2", "step": 0, "weight": 10,
            "lastAnalysis": run.model_dump(mode="json", exclude_none=True)}},
    }
    out = io.StringIO()
    print_status(obj, out)
    return out.getvalue()


def test_a_pending_look_shows_each_gates_statistic_evidence_needed_and_time_to_a_verdict():
    text = status_text(judge(query(after=20), values(version(1000), version(9000))))
    assert "Analysis:    Pending" in text
    assert re.search(r"EVIDENCE\s+STATISTIC\s+TOLERATED\s+DECISIONS\s+NEEDED\s+VERDICT IN", text)
    line = next(x for x in text.splitlines() if x.strip().startswith("fallbackRate") and "[" in x)
    # +0.00 points [lower, upper], tolerated +0.50, 1,000 decisions, more needed, in about N seconds.
    assert re.search(r"\+0\.00 \[-\d+\.\d\d, \+\d+\.\d\d\]\s+\+0\.50\s+1,000\s+[\d,]+\s+~\d+s$", line), line


def test_a_failed_look_says_the_verdict_is_now():
    text = status_text(judge(query(after=10), values(version(500, fallbacks=0.30), version(4500))))
    line = next(x for x in text.splitlines() if x.strip().startswith("fallbackRate") and "[" in x)
    assert line.endswith("now") and "+29.00" in line


def test_a_windowed_analysis_prints_no_evidence_table():
    text = status_text(AnalysisRun(at="2026-03-01T12:00:00Z", step=0, verdict="Pass", message="ok",
                                   checks=[{"name": "fallbackRate", "value": 0.01, "bound": 0.05, "verdict": "Pass"}]))
    assert "fallbackRate" in text and "EVIDENCE" not in text
