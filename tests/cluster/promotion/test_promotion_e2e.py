"""Promotion end to end: the real operator process on the local cluster (KServe's controller, the scheduler, kwok's
simulated predictor pods steered per version), a real Prometheus scraping stand-in pods whose latency/errors/traffic
the test controls.
Route weights, InferenceServices, status and conditions are asserted at every step."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import pytest
from support.e2e_kit import E2E, V1, V2, e2e_fixture, fast_canary
from support.promstack import module_stack

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
]


stack = module_stack()


e2e = e2e_fixture()


def stable_on_v1(e: E2E, **promote) -> None:
    """First deployment of 1.0.0: deployed, no traffic until ready, then 100%."""
    e.create(V1, **fast_canary(**promote))
    e.wait(lambda: V1 in e.isvcs(), "1.0.0 InferenceService")
    ready = e.wait(lambda: e.condition("Ready"), "status written")
    assert ready["status"] == "False" and e.route_weights() == {}  # not ready: never traffic to nothing
    e.set_state(V1, "ready")
    p = e.wait_phase("Idle")
    assert p["stable"] == V1
    e.wait(lambda: e.route_weights() == {V1: 100}, "Route 100% on 1.0.0")
    dm = e.dm()
    assert e.condition("Ready", dm)["status"] == "True" and e.condition("Promoted", dm)["status"] == "True"


def kubectl_wait_ready(e: E2E, timeout: str) -> int:
    """What a pipeline step or an SRE runs: `kubectl wait --for=condition=Ready dm/NAME`."""
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(e.cp.kubeconfig), "-n", e.ns, "wait", "--for=condition=Ready",
         f"decisionmodel/{e.name}", f"--timeout={timeout}"], capture_output=True, text=True, timeout=120,
    ).returncode


def conditions(e: E2E) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in e.dm()["status"]["conditions"]}


def test_clean_canary_to_100_then_warm_switch_back(e2e: E2E):
    e = e2e
    stable_on_v1(e, rollbackWindowSeconds=600)
    e.snapshot("idle", "Healthy")

    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    p = e.wait_phase("Waiting")
    assert p["candidate"] == V2 and e.route_weights() == {V1: 100}
    dm = e.dm()
    c = {x["type"]: (x["status"], x["reason"]) for x in dm["status"]["conditions"]}
    assert c["Ready"] == ("False", "Progressing") and c["Reconciling"][0] == "True" and c["Serving"][0] == "True", (
        dm["status"]["conditions"], dm["status"].get("versions"))
    assert kubectl_wait_ready(e, "2s") != 0  # a pipeline waiting for the new version keeps waiting
    e.snapshot("waiting", "Progressing")

    e.set_state(V2, "ready")
    e.wait(lambda: e.route_weights() == {V1: 90, V2: 10}, "step 1: 10% on the candidate")
    # The Route is written before status (traffic moves first); status follows within the same reconcile.
    p = e.wait(lambda: e.promotion()["phase"] == "Progressing" and e.promotion(), "status of step 1")
    assert p["step"] == 0 and p["weight"] == 10
    e.snapshot("canary-step-1", "Progressing")
    e.wait(lambda: e.route_weights() == {V1: 50, V2: 50}, "step 2: 50%", timeout=60)
    p = e.wait(lambda: e.promotion()["step"] == 1 and e.promotion(), "status of step 2")
    assert p["lastAnalysis"]["verdict"] == "Pass" and p["lastAnalysis"]["step"] == 0
    e.wait(lambda: e.route_weights() == {V2: 100}, "100% on the candidate", timeout=60)
    p = e.wait_phase("Cooling")
    assert (p["stable"], p["previous"], p.get("candidate")) == (V2, V1, None)
    assert set(e.isvcs()) == {V1, V2}  # previous stays warm
    c = conditions(e)
    assert c["Ready"][0] == "True" and c["Promoted"] == ("True", "Promoted") and c["Stalled"][0] == "False"
    assert kubectl_wait_ready(e, "30s") == 0
    rec = p["history"][-1]
    assert (rec["version"], rec["fromVersion"], rec["outcome"]) == (V2, V1, "Succeeded")
    e.snapshot("cooling", "Healthy")

    # Re-promote the still-warm 1.0.0: no new InferenceService, no waiting, no canary.
    uid = e.isvcs()[V1]["metadata"]["uid"]
    e.patch_promote(version=V1)
    e.wait(lambda: e.route_weights() == {V1: 100}, "instant switch back")
    p = e.wait(lambda: e.promotion()["stable"] == V1 and e.promotion(), "status of the switch")
    assert p["phase"] == "Cooling" and p["previous"] == V2
    assert p["history"][-1]["reason"] == "WarmSwitch" and e.isvcs()[V1]["metadata"]["uid"] == uid


def test_latency_breach_at_step_two_rolls_back_then_retry_succeeds(e2e: E2E):
    e = e2e
    stable_on_v1(e)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "ready")
    e.wait(lambda: e.route_weights() == {V1: 50, V2: 50}, "step 2", timeout=60)
    e.pods[V2].control(latency_ms=400)  # p95 far above the 150 ms SLA
    e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on stable", timeout=60)
    p = e.wait_phase("Failed")
    assert p["failureReason"] == "AnalysisFailed" and p["stable"] == V1 and p.get("candidate") is None
    assert p["lastAnalysis"]["verdict"] == "Fail" and p["lastAnalysis"]["p95LatencyMs"] > 150
    assert "step 2/2" in p["failureMessage"] and "bound 150.0ms" in p["failureMessage"]
    e.wait(lambda: set(e.isvcs()) == {V1}, "candidate stopped")
    c = conditions(e)
    assert c["Ready"] == ("False", "AnalysisFailed") and c["Stalled"] == ("True", "AnalysisFailed")
    assert c["Promoted"] == ("False", "AnalysisFailed") and c["Serving"][0] == "True"
    e.snapshot("failed-analysis", "Degraded")

    # Not retried by itself; a new retry annotation value runs it again (with the candidate now healthy).
    e.pods[V2].control(latency_ms=40)
    e.annotate("arbiter.dev/retry", datetime.now(UTC).isoformat())
    e.wait(lambda: V2 in e.isvcs(), "candidate redeployed on retry")
    e.set_state(V2, "ready")
    e.wait(lambda: e.route_weights() == {V2: 100}, "retry promoted", timeout=120)
    # The Route is written before the status that records the outcome: wait for the phase, then read the history.
    p = e.wait_phase("Cooling", "Idle")
    assert [r["outcome"] for r in p["history"]][-2:] == ["RolledBack", "Succeeded"]


def test_error_rate_breach_rolls_back(e2e: E2E):
    e = e2e
    stable_on_v1(e)
    e.pods[V2].control(error_rate=0.3)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "ready")
    p = e.wait_phase("RollingBack", "Failed", timeout=60)
    assert p["failureReason"] == "AnalysisFailed" and "error rate above maxErrorRate" in p["failureMessage"]
    assert 0.2 <= p["lastAnalysis"]["errorRate"] <= 0.4
    assert e.route_weights() == {V1: 100}


def test_no_traffic_fails_at_once_when_asked(e2e: E2E):
    e = e2e
    stable_on_v1(e, analysis={"intervalSeconds": 5, "minRequests": 20, "insufficientTraffic": "Fail"})
    e.pods[V2].control(rps=0)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "ready")
    p = e.wait_phase("RollingBack", "Failed", timeout=60)
    assert p["failureReason"] == "AnalysisFailed" and "insufficient traffic" in p["failureMessage"]
    assert p["lastAnalysis"]["verdict"] == "NoData" and e.route_weights() == {V1: 100}


def test_no_traffic_waits_then_hits_the_progress_deadline(e2e: E2E):
    e = e2e
    stable_on_v1(e, progressDeadlineSeconds=30)
    e.pods[V2].control(rps=0)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "ready")
    # Held at step 1 (Suspended for Argo CD) while the analysis sees no traffic.
    e.wait(lambda: (e.promotion().get("lastAnalysis") or {}).get("verdict") == "NoData"
           and e.promotion()["step"] == 0 and e.promotion()["phase"] == "Progressing", "held for traffic")
    assert e.route_weights() == {V1: 90, V2: 10}
    e.snapshot("waiting-for-traffic", "Suspended")
    p = e.wait_phase("RollingBack", "Failed", timeout=90)
    assert p["failureReason"] == "ProgressDeadlineExceeded" and "minRequests=20" in p["failureMessage"]
    e.wait(lambda: e.route_weights() == {V1: 100}, "back on stable")


def test_abort_by_pointing_the_spec_back_at_stable(e2e: E2E):
    e = e2e
    stable_on_v1(e)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "ready")
    e.wait(lambda: e.route_weights() == {V1: 90, V2: 10}, "step 1")
    e.patch_promote(version=V1)
    e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on stable")
    e.wait(lambda: set(e.isvcs()) == {V1}, "candidate stopped")
    p = e.wait_phase("Idle")
    assert p["history"][-1]["outcome"] == "Aborted"
    c = conditions(e)
    assert c["Ready"][0] == "True" and c["Stalled"][0] == "False"


def test_candidate_crash_rolls_back(e2e: E2E):
    e = e2e
    stable_on_v1(e)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.set_state(V2, "failed")
    p = e.wait_phase("RollingBack", "Failed")
    assert p["failureReason"] == "CandidateFailed" and "last exit Error (exit code 1)" in p["failureMessage"], p
    assert e.route_weights() == {V1: 100}


def assert_safe(e: E2E) -> None:
    """The restart invariants, as the cluster shows them."""
    p = e.promotion()
    weights = e.route_weights()
    isvcs = e.isvcs()
    if weights:
        assert sum(weights.values()) == 100
        assert set(weights) <= set(isvcs), f"traffic to a version without InferenceService: {weights}"
    allowed = {v for v in (p.get("stable"), p.get("candidate"), p.get("previous")) if v}
    assert set(isvcs) <= allowed | {p.get("failedVersion")}, f"orphan InferenceService: {set(isvcs)} vs {p}"


def test_operator_killed_at_each_phase_resumes(e2e: E2E):
    e = e2e
    stable_on_v1(e)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
    e.wait_phase("Waiting")

    # Killed while waiting; the candidate becomes ready while no operator runs.
    e.kill_operator()
    e.set_state(V2, "ready")
    assert_safe(e)
    e.start_operator()
    e.wait(lambda: e.route_weights() == {V1: 90, V2: 10}, "resumed into step 1")

    # Killed mid-canary: weights stay as they were (the Route is not touched by a dead operator), then continue.
    e.kill_operator()
    assert e.route_weights() == {V1: 90, V2: 10}
    assert_safe(e)
    e.start_operator()
    e.wait(lambda: e.route_weights() == {V2: 100}, "resumed to 100%", timeout=90)
    e.wait_phase("Cooling")

    # Killed while cooling; the warm previous version is re-promoted while no operator runs: instant on restart.
    e.kill_operator()
    e.patch_promote(version=V1)
    assert_safe(e)
    e.start_operator()
    e.wait(lambda: e.route_weights() == {V1: 100}, "warm switch after restart")
    p = e.wait(lambda: e.promotion()["stable"] == V1 and e.promotion(), "status of the switch")
    assert p["previous"] == V2 and p["phase"] == "Cooling"
    assert_safe(e)

    # Killed right after a rollback: the candidate still gets stopped, never orphaned, traffic stays on stable.
    e.pods[V2].control(latency_ms=400)
    e.set_state(V2, "pending")  # the warm 1.1.0 is not ready: promoting it runs a normal canary
    e.wait(lambda: not next(v for v in e.dm()["status"]["versions"] if v["name"] == V2)["ready"], "1.1.0 not ready")
    e.patch_promote(version=V2)
    e.wait_phase("Waiting")
    e.set_state(V2, "ready")
    e.wait(lambda: e.route_weights() == {V1: 90, V2: 10}, "step 1")
    e.wait(lambda: e.route_weights() == {V1: 100}, "rolled back", timeout=60)
    e.kill_operator()
    assert_safe(e)
    e.start_operator()
    p = e.wait_phase("Failed")
    e.wait(lambda: set(e.isvcs()) == {V1}, "rolled-back candidate stopped after restart")
    assert p["stable"] == V1 and p["failureReason"] == "AnalysisFailed" and e.route_weights() == {V1: 100}
