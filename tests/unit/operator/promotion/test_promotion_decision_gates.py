"""The decision gates of the promotion analysis, on plain numbers: what a user reads in status when a candidate falls
back, violates its schema, is unsure, shifts the decision mix, breaks a custom check, or disagrees in shadow; and
that nothing Prometheus (or a proxy in front of it) answers can crash the analysis or pass a candidate."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import pytest
from arbiter_operator.api.promotion import (
    Analysis,
    CanaryStep,
    MetricCheck,
    PromoteSpec,
    PromotionStatus,
    Shadow,
)
from arbiter_operator.observe.analysis import run_analysis
from arbiter_operator.promotion import analysis_due, judge
from arbiter_operator.promotion.analysis import AnalysisQuery, VersionBounds, mix_shift
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS, MODEL = "risk", "credit"


def spec(**analysis) -> PromoteSpec:
    return PromoteSpec(
        version="v2",
        strategy="Canary",
        steps=[CanaryStep(weight=10, holdSeconds=60)],
        analysis=Analysis(**{"intervalSeconds": 30, "minRequests": 50, **analysis}),
    )


def query(s: PromoteSpec | None = None, *, shadow: bool = False, bounds: VersionBounds | None = None) -> AnalysisQuery:
    s = s or spec()
    if shadow:
        s = s.model_copy(update={"strategy": "Shadow", "shadow": s.shadow or Shadow(holdSeconds=120, minCompared=100)})
        status = PromotionStatus(phase="Shadowing", stable="v1", candidate="v2", step=-1,
                                 stepStartedAt="2026-03-01T12:00:00Z")
    else:
        status = PromotionStatus(phase="Progressing", stable="v1", candidate="v2", step=0, weight=10,
                                 stepStartedAt="2026-03-01T12:00:00Z")
    q = analysis_due(s, status, T0 + timedelta(seconds=60), namespace=NS, model=MODEL, sla_p95_ms=150,
                     version_bounds=bounds)
    assert q is not None
    return q


def healthy(**over) -> dict:
    """500 decisions, p95 80 ms, nothing wrong, the same decision mix as the stable version."""
    values = {
        "requests": 500.0, "errors": 0.0, "decision_p95": 0.08, "vllm_p95": None, "fallbacks": 0.0,
        "low_confidence": 0.0, "schema_violations": 0.0, "fallback_reasons": {},
        "labels": {"approve": 300.0, "decline": 200.0}, "stable_labels": {"approve": 2700.0, "decline": 1800.0},
    }
    values.update(over)
    return values


def check(run, name):
    return next(c for c in run.checks if c.name == name)


def test_healthy_candidate_passes_and_status_lists_every_gate_with_value_and_bound():
    run = judge(query(), healthy())
    assert run.verdict == "Pass", run.message
    names = [c.name for c in run.checks]
    assert names == ["p95LatencyMs", "errorRate", "fallbackRate", "lowConfidenceRate", "schemaViolationRate",
                     "decisionMixShift"]
    assert check(run, "fallbackRate").value == 0 and check(run, "fallbackRate").bound == 0.05
    assert check(run, "decisionMixShift").value == pytest.approx(0.0)
    assert all(c.verdict == "Pass" for c in run.checks)


def test_a_candidate_that_always_falls_back_fails_naming_metric_value_and_bound():
    run = judge(query(), healthy(fallbacks=500.0, fallback_reasons={"upstream_down": 500.0}))
    assert run.verdict == "Fail"
    assert "fallback rate 100.00% above max 5.00%" in run.message
    c = check(run, "fallbackRate")
    assert (c.value, c.bound, c.direction, c.verdict) == (1.0, 0.05, "max", "Fail")


def test_per_reason_fallback_bound():
    s = spec(maxFallbackRate=0.5, maxFallbackRateByReason={"deadline": 0.01})
    run = judge(query(s), healthy(fallbacks=50.0, fallback_reasons={"deadline": 40.0, "invalid": 10.0}))
    assert run.verdict == "Fail" and "fallback rate (deadline) 8.00% above max 1.00%" in run.message
    assert check(run, "fallbackRate").verdict == "Pass"
    assert check(run, "fallbackRate/deadline").value == pytest.approx(0.08)


def test_schema_violations_fail_the_candidate():
    run = judge(query(), healthy(schema_violations=25.0))
    assert run.verdict == "Fail" and "schema violation rate 5.00% above max 1.00%" in run.message


def test_low_confidence_counts_flagged_and_fallback_decisions():
    run = judge(query(), healthy(low_confidence=100.0, fallbacks=0.0, fallback_reasons={"low_confidence": 60.0},
                                 ), )
    c = check(run, "lowConfidenceRate")
    assert c.value == pytest.approx(160 / 500) and c.verdict == "Fail"
    assert "low-confidence rate 32.00% above max 25.00%" in run.message


def test_a_window_with_no_decisions_and_min_requests_zero_is_judged_not_crashed():
    # minRequests 0 lets an empty window (a latency sample left from before) through to the gates: each rate is no
    # data, never a division by zero that would fail every pass of this DecisionModel.
    run = judge(query(spec(minRequests=0)), healthy(requests=0.0, labels={}))
    assert check(run, "lowConfidenceRate").verdict == "NoData"
    assert check(run, "errorRate").verdict == "NoData"


def test_a_shifted_decision_mix_fails_and_names_the_label():
    run = judge(query(), healthy(labels={"approve": 450.0, "decline": 50.0}))
    assert run.verdict == "Fail"
    assert "decision mix shift 30.00% above max 10.00% (label 'approve')" in run.message
    assert check(run, "decisionMixShift").value == pytest.approx(0.3)


def test_a_new_label_only_the_candidate_uses_counts_as_shift():
    assert mix_shift({"approve": 50, "refer": 50}, {"approve": 100})[:2] == (pytest.approx(0.5), "approve")
    assert mix_shift({}, {"approve": 1}) is None and mix_shift({"a": 1}, {}) is None


def test_a_mix_the_stable_version_barely_served_holds_the_step_never_passes_it():
    # A 95% canary step leaves the stable version a trickle: an approve-all candidate must not pass on "not judged".
    for stable in ({}, {"approve": 3.0, "decline": 6.0}):
        run = judge(query(), healthy(stable_labels=stable, labels={"approve": 500.0}))
        c = check(run, "decisionMixShift")
        assert c.verdict == "Pending" and "waits for the stable version" in c.message and "fewer than 50" in c.message
        assert run.verdict == "NoData" and "not enough evidence" in run.message
    # No mix series from either version at all (an exporter without them): no data, never a pass.
    run = judge(query(), healthy(stable_labels={}, labels={}))
    assert check(run, "decisionMixShift").verdict == "NoData" and run.verdict == "Inconclusive"


def test_bounds_default_from_version_metadata_and_the_spec_wins():
    q = query(bounds=VersionBounds(max_fallback_rate=0.2, max_low_confidence_rate=0.5))
    run = judge(q, healthy(fallbacks=50.0))
    assert run.verdict == "Pass" and check(run, "fallbackRate").bound == 0.2
    assert check(run, "lowConfidenceRate").bound == 0.5
    q = query(spec(maxFallbackRate=0.01), bounds=VersionBounds(max_fallback_rate=0.2))
    assert judge(q, healthy(fallbacks=50.0)).verdict == "Fail"


def test_vllm_bounds_are_off_by_default_and_judged_when_set():
    assert "queue_p95" not in query().queries and "kv_cache" not in query().queries
    q = query(spec(maxQueueTimeP95Ms=50, maxKvCacheUsage=0.9))
    assert "vllm:request_queue_time_seconds_bucket" in q.queries["queue_p95"]
    assert "vllm:kv_cache_usage_perc" in q.queries["kv_cache"]
    run = judge(q, healthy(queue_p95=0.2, kv_cache=0.5))
    assert run.verdict == "Fail" and "vLLM queue time p95 200.0ms above max 50.0ms" in run.message
    # A bound the user set, without data: not a pass.
    run = judge(q, healthy(queue_p95=None, kv_cache=0.5))
    assert run.verdict == "Inconclusive" and "queueTimeP95Ms" in run.message


def test_custom_checks_expand_placeholders_and_judge_both_directions():
    checks = [
        MetricCheck(name="p99", query='histogram_quantile(0.99, rate(x_bucket{ {{candidate}} }[{{window}}]))',
                    bound=0.3),
        MetricCheck(name="approvals", query='sum(rate(y{ {{stable}} }[{{window}}])) - {{candidateVersion}}',
                    bound=10, direction="min"),
    ]
    q = query(spec(checks=checks))
    assert q.queries["check:p99"] == (
        'histogram_quantile(0.99, rate(x_bucket{ namespace="risk",arbiter_dev_decision_model="credit",'
        'arbiter_dev_version="v2" }[30s]))'
    )
    assert 'arbiter_dev_version="v1"' in q.queries["check:approvals"] and q.queries["check:approvals"].endswith("- v2")
    run = judge(q, healthy(**{"check:p99": 0.2, "check:approvals": 12}))
    assert run.verdict == "Pass" and check(run, "approvals").direction == "min"
    run = judge(q, healthy(**{"check:p99": 0.2, "check:approvals": 3}))
    assert run.verdict == "Fail" and "approvals 3 below min 10" in run.message
    assert check(run, "approvals").value == 3 and check(run, "approvals").bound == 10
    run = judge(q, healthy(**{"check:p99": None, "check:approvals": 12}))
    assert run.verdict == "Inconclusive" and "no data for p99" in run.message


def test_check_names_must_be_unique():
    with pytest.raises(ValueError, match="unique"):
        spec(checks=[MetricCheck(name="a", query="1", bound=1), MetricCheck(name="a", query="2", bound=1)])


def test_shadow_waits_for_comparisons_then_judges_agreement_with_confusion():
    q = query(shadow=True)
    # The whole shadow phase so far (60 s), less the second stepStartedAt may have been truncated by.
    assert q.shadow and q.window_seconds == 59
    assert 'candidate="v2"' in q.vectors["shadow_agree"].promql and 'arbiter_dev_version="v1"' in q.vectors[
        "shadow_agree"].promql
    run = judge(q, healthy(shadow_agree={"true": 40.0, "false": 2.0}, shadow_requests={"sent": 50.0, "error": 8.0}))
    assert run.verdict == "NoData" and "waiting for shadow data: 42 compared" in run.message
    assert "minCompared=100" in run.message and "error 8" in run.message
    run = judge(q, healthy(shadow_agree={"true": 180.0, "false": 20.0},
                           shadow_confusion={"approve->decline": 15.0, "decline->approve": 5.0}))
    assert run.verdict == "Fail"
    assert "shadow agreement 90.00% below min 95.00%" in run.message and "approve->decline 15" in run.message
    c = check(run, "agreement")
    assert (c.value, c.bound, c.direction) == (0.9, 0.95, "min")
    run = judge(q, healthy(shadow_agree={"true": 199.0, "false": 1.0}))
    assert run.verdict == "Pass" and check(run, "agreement").value == pytest.approx(0.995)


# --- hostile Prometheus answers ------------------------------------------------------------------------------------

garbage = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30), st.text(max_size=12),
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), st.one_of(st.floats(allow_nan=True), st.text(max_size=4), st.none()),
                    max_size=4),
)
NAMES = ["requests", "errors", "decision_p95", "vllm_p95", "fallbacks", "low_confidence", "schema_violations",
         "queue_p95", "kv_cache", "check:c1", "fallback_reasons", "labels", "stable_labels", "shadow_agree",
         "shadow_requests", "shadow_confusion"]
HOSTILE_SPEC = spec(maxQueueTimeP95Ms=10, maxKvCacheUsage=0.5, maxFallbackRateByReason={"deadline": 0.1},
                    checks=[MetricCheck(name="c1", query="vector(1)", bound=1)])


def _parsed(value):
    """A sample value as Prometheus writes it (a number in a string, e.g. "100") or a number; None for the rest."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


@settings(max_examples=400, deadline=None)
@example(values={"requests": "100"}, shadow=False)  # Prometheus's wire format: a sample value is a string
@given(values=st.dictionaries(st.sampled_from(NAMES), garbage), shadow=st.booleans())
def test_any_answer_gives_a_verdict_never_a_crash_and_bad_numbers_never_pass(values, shadow):
    run = judge(query(HOSTILE_SPEC, shadow=shadow), values)
    assert run.verdict in ("Pass", "Fail", "NoData", "Inconclusive") and run.message
    requests = _parsed(values.get("requests"))
    usable = requests is not None and math.isfinite(requests) and requests >= 50
    if not usable:
        assert run.verdict == "NoData" and "minRequests=50" in run.message
    if run.verdict == "Pass":
        # Every gate the user set had a real number.
        assert all(c.value is not None and math.isfinite(c.value) for c in run.checks if c.name != "decisionMixShift")
    for c in run.checks:
        assert c.value is None or math.isfinite(c.value)
    run.model_dump_json()  # status must always be writable


class HostileQuerier:
    """Stands in for the Prometheus client's answer shape: a list of (labels, value) or an exception."""

    def __init__(self, answers):
        self.answers = answers
        self.n = 0

    async def query(self, promql, at=None):
        self.n += 1
        answer = self.answers[self.n % len(self.answers)]
        if isinstance(answer, Exception):
            raise answer
        return answer


sample = st.tuples(st.one_of(st.dictionaries(st.sampled_from(["label", "agree", "reason", "result", "x"]),
                                             st.text(max_size=5), max_size=3), st.none(), st.text(max_size=3)),
                   garbage)
answer = st.one_of(
    st.lists(sample, max_size=4), garbage,
    st.sampled_from([RuntimeError("HTTP 500 from prometheus"), ValueError("bad json"), TimeoutError()]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=st.lists(answer, min_size=1, max_size=6), shadow=st.booleans())
def test_run_analysis_survives_any_prometheus_answer(answers, shadow):
    run = asyncio.run(run_analysis(HostileQuerier(answers), query(HOSTILE_SPEC, shadow=shadow)))
    assert run.verdict in ("Pass", "Fail", "NoData", "Inconclusive") and run.message
    if any(isinstance(a, Exception) for a in answers):
        assert run.verdict == "Inconclusive" and "metrics query failed" in run.message


def test_a_mix_shift_above_the_bound_but_within_noise_holds_the_step_never_passes_it():
    # 60 vs 60 decisions: a 15-point difference is well within three standard errors (about 27 points): not yet a
    # failure, and not a pass either (the documented fail-open: an approve-all candidate at 1.2 decisions/s).
    q = query()
    run = judge(q, healthy(requests=60.0, labels={"approve": 33.0, "decline": 27.0},
                           stable_labels={"approve": 24.0, "decline": 36.0}))
    c = check(run, "decisionMixShift")
    assert c.value == pytest.approx(0.15) and c.verdict == "Pending" and "within noise" in c.message
    assert run.verdict == "NoData" and "within noise" in run.message
    # The same shares over 6000 decisions each: significant, and above the bound.
    run = judge(q, healthy(requests=6000.0, labels={"approve": 3300.0, "decline": 2700.0},
                           stable_labels={"approve": 2400.0, "decline": 3600.0}))
    assert run.verdict == "Fail" and "decision mix shift 15.00% above max 10.00% (label 'approve')" in run.message
    # Below the bound it passes, noise or not.
    run = judge(q, healthy(requests=60.0, labels={"approve": 27.0, "decline": 33.0},
                           stable_labels={"approve": 24.0, "decline": 36.0}))
    assert check(run, "decisionMixShift").verdict == "Pass" and run.verdict == "Pass"
