"""Canaries decided by evidence, end to end: the real operator process on the local cluster, a real Prometheus
scraping REAL decision-server processes, one per version (decision_e2e_kit.py), their traffic set by the test.

- The two ways a decision mix that cannot be judged used to pass a step now hold it (here: fail it at the end of the
  hold, `insufficientTraffic: Fail`): a 95% step that leaves the stable version fewer than minRequests decisions per
  window, and a shift far above the bound at 1.2 decisions/s that chance alone could explain.
- Sequential analysis: a candidate whose rules decide 30% of decisions is rolled back within 10 s of traffic at
  50 decisions/s, and a candidate that decides like the stable version is promoted at the end of its hold, never rolled
  back."""

from __future__ import annotations

import time

import pytest
from support.decision_e2e_kit import DecisionE2E
from support.e2e_kit import V1, V2, e2e_fixture, fast_canary
from support.promstack import module_stack
from support.runtime_procs import Traffic

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Latency is not what these tests judge (the decision servers share two cores with the whole cluster): a loose bound.
LOOSE = {"p95LatencyMs": 3000, "minRequests": 20}
SEQUENTIAL = {**LOOSE, "mode": "Sequential", "sequential": {"lookSeconds": 1}}
RATE = 50.0  # decisions/s to the candidate in the Sequential tests
CALLERS = 5  # closed-loop callers sharing RATE (one alone cannot keep 50/s on two busy cores)

stack = module_stack()

e2e = e2e_fixture(DecisionE2E)


def to_the_candidate_step(e: DecisionE2E, candidate: str, rates: dict[str, float], **promote) -> dict:
    """1.0.0 stable, then 1.1.0 (upstream behaving as `candidate`) deployed, ready and in its first step; each
    version's decisions/s as `rates` says from the start."""
    e.create(V1, candidate=candidate, **promote)
    for version, rps in rates.items():
        e.traffic.set(e.procs[version], rps)
    e.wait(lambda: V1 in e.isvcs(), "1.0.0 InferenceService")
    e.set_state(V1, "ready")
    e.wait_phase("Idle")
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    return e.wait_phase("Progressing", timeout=60)


@pytest.mark.parametrize(
    ("case", "rates", "analysis", "steps"),
    [
        # The stable version keeps 5% of the traffic: 1/s, 5 decisions per 5 s window, fewer than minRequests=20.
        ("a 95% step", {V1: 1.0, V2: 8.0}, {**LOOSE, "intervalSeconds": 5}, [{"weight": 95, "holdSeconds": 8}]),
        # 1.2 decisions/s on each version, minRequests 3 (6 expected per 5 s window: a missed scrape on a busy
        # machine still leaves the window counted): a 60-point shift over 6 decisions each is within noise.
        ("1.2 decisions/s", {V1: 1.2, V2: 1.2}, {**LOOSE, "intervalSeconds": 5, "minRequests": 3},
         [{"weight": 50, "holdSeconds": 8}]),
    ],
)
def test_an_approve_all_candidate_whose_mix_cannot_be_judged_is_not_promoted(e2e, case, rates, analysis, steps):
    e = e2e
    to_the_candidate_step(e, "approve_all", rates, **fast_canary(analysis={**analysis, "insufficientTraffic": "Fail"},
                                                                 steps=steps))
    p = e.wait_phase("Failed", "RollingBack", "Idle", "Cooling", timeout=90)
    assert p["stable"] == V1, f"{case}: the approve-all candidate was promoted: {p}"
    assert p["failureReason"] == "AnalysisFailed", p
    message = e.condition("Stalled")["message"]
    checks = p["lastAnalysis"].get("checks") or []
    if not checks:
        # The last window's count fell below minRequests (the gates were not read): held for want of traffic too.
        assert "insufficient traffic" in message and "fewer than minRequests" in message, (message, p)
        e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on 1.0.0")
        return
    mix = next(c for c in checks if c["name"] == "decisionMixShift")
    # Held for want of evidence (failed at the end of the hold), or shown to be shifted: never passed.
    assert mix["verdict"] in ("Pending", "Fail"), mix
    if mix["verdict"] == "Pending":
        assert "insufficient traffic" in message and ("waits for the stable version" in message
                                                      or "within noise" in message), message
    e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on 1.0.0")


def callers(e: DecisionE2E, version: str, rps: float) -> list[Traffic]:
    return [e.fleet.traffic({e.procs[version]: rps / CALLERS}) for _ in range(CALLERS)]


def answered(e: DecisionE2E, version: str, traffic: list[Traffic]) -> int:
    return sum(t.answered.get(version, 0) for t in [e.traffic, *traffic])


def test_sequential_rolls_back_a_30_percent_fallback_candidate_within_10_seconds_of_traffic(e2e):
    e = e2e
    # The candidate's traffic starts with its step, at 50 decisions/s.
    to_the_candidate_step(e, "fallback_30", {V2: 0}, **fast_canary(analysis=SEQUENTIAL,
                                                                   steps=[{"weight": 10, "holdSeconds": 60}]))
    before, started = answered(e, V2, []), time.monotonic()
    extra = callers(e, V2, RATE)
    p = e.wait_phase("Failed", "RollingBack", timeout=30)
    took = time.monotonic() - started
    rate = (answered(e, V2, extra) - before) / took
    print(f"sequential rollback: {took:.1f} s of traffic at {rate:.0f} decisions/s")
    assert took <= 10, f"rolled back after {took:.1f} s of traffic"
    assert rate >= 0.8 * RATE, f"the candidate got {rate:.0f} decisions/s"
    assert p["failureReason"] == "AnalysisFailed" and p["stable"] == V1
    # The first check the evidence settled failed it, and only what 30% fallbacks explain can have: the fallback rate,
    # the upstream errors behind them (errorRate), or the mix the rules' labels shift. Which one comes first depends
    # on how the decisions fall into the sequential looks; never the latency.
    failed = {c["name"]: c for c in p["lastAnalysis"]["checks"] if c["verdict"] == "Fail"}
    assert failed and set(failed) <= {"fallbackRate", "fallbackRate/upstream_error", "errorRate",
                                      "decisionMixShift"}, p["lastAnalysis"]["checks"]
    if "fallbackRate" in failed:
        # Shown beyond the tolerated regression against the stable version, or beyond maxFallbackRate on its own
        # (whichever the evidence showed first: the stable version's few decisions since the step began leave its
        # interval wide at first).
        message = failed["fallbackRate"]["message"]
        assert "more than the tolerated" in message or "above max 5.00%" in message, failed
    stalled = e.condition("Stalled")["message"]
    assert any(words in stalled for words in ("fallback rate", "error rate", "decision mix shift")), stalled
    e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on 1.0.0")


def test_sequential_promotes_an_identical_candidate_at_its_maximum_hold_without_a_false_rollback(e2e):
    e = e2e
    hold = 15
    to_the_candidate_step(e, "healthy", {V2: 0}, **fast_canary(analysis=SEQUENTIAL, rollbackWindowSeconds=0,
                                                               steps=[{"weight": 50, "holdSeconds": hold}]))
    started = time.monotonic()
    callers(e, V2, RATE)
    p = e.wait_phase("Idle", "Failed", "RollingBack", timeout=60)
    assert p["stable"] == V2 and not p.get("failureReason"), p
    assert [r["outcome"] for r in p["history"]][-1] == "Succeeded"
    last = p["lastAnalysis"]
    assert last["verdict"] == "Pass" and "at the end of the hold" in last["message"], last
    assert time.monotonic() - started >= hold - 2  # not before its hold: the evidence alone did not suffice
    assert all(c["verdict"] == "Pass" and c["evidence"]["lower"] <= c["evidence"]["tolerated"]
               for c in last["checks"]), last["checks"]
