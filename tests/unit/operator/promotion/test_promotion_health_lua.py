"""The Argo CD health check (helm/arbiter/health/decisionmodel.lua), run by a real Lua interpreter (lupa) against
DecisionModel snapshots produced by the operator's planner at each phase of a promotion."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from arbiter_operator.promotion import analysis_due, judge
from support.argocd_health import health
from support.paths import REPO
from support.plannerdrive import Driver, candidate_ready, failing_canary, same_mix, two_versions

SNAPSHOTS = REPO / "tests" / "support" / "snapshots"


def test_health_follows_a_promotion_through_every_phase():
    d = Driver(two_versions("1.0.0", strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}],
                            progressDeadlineSeconds=300, rollbackWindowSeconds=120,
                            analysis={"intervalSeconds": 30, "minRequests": 50}))
    seen: dict[str, dict] = {}

    s = d.reconcile()
    assert health(s)[0] == "Progressing"  # first deployment, nothing ready
    d.set_ready("1.0.0")
    s = d.reconcile(5)
    status, message = health(s)
    assert status == "Healthy" and "1.0.0" in message
    seen["idle"] = s

    # Git changes spec.promote; until the operator writes status for the new generation, never "Healthy".
    d.edit_spec(version="1.1.0")
    status, message = health(d.body)
    assert status == "Progressing" and "generation 2" in message
    seen["unobserved"] = copy.deepcopy(d.body)

    s = d.reconcile(1)
    assert health(s)[0] == "Progressing"
    seen["deploying"] = s
    d.set_ready("1.1.0")
    s = d.reconcile(2)
    assert s["status"]["promotion"]["phase"] == "Progressing" and health(s)[0] == "Progressing"
    seen["canary"] = s

    # Hold over, too little traffic: held, shown as Suspended with the numbers.
    d.now += timedelta(seconds=60)
    s = d.reconcile(0, d.analysis(0.05, 0, 3))
    status, message = health(s)
    assert status == "Suspended" and "fewer than minRequests=50" in message
    seen["waiting-for-traffic"] = s

    # Traffic arrives and the step passes: promoted, previous warm: Healthy.
    d.now += timedelta(seconds=30)
    s = d.reconcile(0, d.analysis(0.05, 0, 500))
    assert s["status"]["promotion"]["phase"] == "Cooling"
    assert health(s)[0] == "Healthy"
    seen["cooling"] = s


def test_failed_promotion_is_degraded_while_stable_serves():
    d, s = failing_canary()
    status, message = health(s)
    assert status == "Degraded" and message.startswith("AnalysisFailed:") and "400.0ms" in message
    serving = next(c for c in s["status"]["conditions"] if c["type"] == "Serving")
    assert serving["status"] == "True"
    s = d.reconcile(1)
    assert s["status"]["promotion"]["phase"] == "Failed" and health(s)[0] == "Degraded"


def test_stable_down_is_degraded_not_progressing():
    d = Driver(two_versions("1.0.0"))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.set_ready("1.0.0", False)
    s = d.reconcile(5)
    assert health(s)[0] == "Degraded"


def test_no_status_yet_is_progressing():
    assert health(two_versions())[0] == "Progressing"


@pytest.mark.parametrize("path", sorted(SNAPSHOTS.glob("*.json")), ids=lambda p: p.stem)
def test_snapshots_from_the_real_operator(path):
    """Snapshots recorded by the end-to-end tests (tests/cluster/promotion/test_promotion_e2e.py) from the real
    operator: each file holds the object and the health Argo CD must show for it."""
    case = json.loads(path.read_text())
    assert health(case["object"])[0] == case["health"]


def _failed_promotion() -> dict:
    d, _ = failing_canary()
    return d.reconcile(1)


def test_degraded_message_names_the_stable_version_from_status_promotion():
    s = _failed_promotion()
    for c in s["status"]["conditions"]:  # whatever the conditions happen to say
        c["message"] = "something went wrong"
    status, message = health(s)
    assert status == "Degraded"
    assert "promotion of 1.1.0 failed" in message and "stable version 1.0.0 keeps serving" in message


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(stalled_message=st.text(max_size=200), reason=st.text(min_size=1, max_size=40),
       stable=st.text(alphabet="0123456789.abc-", min_size=1, max_size=20), failed=st.booleans())
def test_every_degraded_message_names_the_stable_version(stalled_message, reason, stable, failed):
    """Hostile condition text and promotion fields: Degraded always says which version serves."""
    s = copy.deepcopy(_FAILED)
    s["status"]["promotion"]["stable"] = stable
    if not failed:
        s["status"]["promotion"]["phase"] = "Idle"
    for c in s["status"]["conditions"]:
        if c["type"] == "Stalled":
            c.update(message=stalled_message, reason=reason)
    status, message = health(s)
    assert status == "Degraded" and f"stable version {stable} keeps serving" in message


_FAILED = _failed_promotion()


def test_waiting_for_approval_is_suspended_then_healthy_once_approved():
    d = candidate_ready(strategy="Canary", steps=[{"weight": 20, "holdSeconds": 60}],
                        approval="Required", analysis={"intervalSeconds": 60, "minRequests": 50})
    d.now += timedelta(seconds=60)
    s = d.reconcile(0, d.analysis(0.05, 0, 500))
    assert s["status"]["promotion"]["phase"] == "Paused"
    status, message = health(s)
    assert status == "Suspended" and "Waiting for approval: 1.1.0" in message and "kubectl arbiter approve" in message
    d.body["metadata"]["annotations"] = {"arbiter.dev/approve": "1.1.0@now"}
    s = d.reconcile(1)
    assert health(s)[0] == "Healthy"


def test_shadow_phase_is_progressing_suspended_without_data_and_degraded_on_disagreement():
    d = candidate_ready(strategy="Shadow",
                        shadow={"holdSeconds": 120, "minCompared": 100, "minAgreement": 0.95},
                        analysis={"intervalSeconds": 30, "minRequests": 50})
    s = d.snapshot
    assert s["status"]["promotion"]["phase"] == "Shadowing" and health(s)[0] == "Progressing"

    def run(agree, disagree):
        dm = d.dm()
        q = analysis_due(dm.spec.promote, dm.status.promotion, d.now, namespace="team", model=dm.metadata.name,
                         sla_p95_ms=150)
        return judge(q, {"requests": 500, "errors": 0, "decision_p95": 0.05,
                         "shadow_agree": {"true": agree, "false": disagree}, **same_mix(500)})

    d.now += timedelta(seconds=30)
    s = d.reconcile(0, run(10, 0))
    status, message = health(s)
    assert status == "Suspended" and "Shadow phase waits for data" in message and "minCompared=100" in message
    d.now += timedelta(seconds=30)
    s = d.reconcile(0, run(150, 50))
    status, message = health(s)
    assert status == "Degraded" and message.startswith("ShadowAnalysisFailed:")
    assert "shadow agreement 75.00% below min 95.00%" in message and "stable version 1.0.0 keeps serving" in message
