"""The Events a user reads in `kubectl describe dm` / `kubectl get events`, through the real planner: a first
deployment is one Event once it serves (its progress is in status), a later promotion keeps one Event per transition,
and a first deployment that fails says why in a Warning."""

from __future__ import annotations

from support.plannerdrive import Driver, candidate_ready, two_versions


def _reasons(d: Driver) -> list[str]:
    return [e.reason for e in d.events]


def test_a_first_deployment_is_one_ready_event_that_says_how_it_went():
    d = Driver(two_versions("1.0.0"))
    d.reconcile()
    d.reconcile(1)  # the InferenceService exists, loading
    assert d.snapshot["status"]["promotion"]["phase"] == "Waiting" and d.events == []
    d.set_ready("1.0.0")
    d.reconcile(42)
    assert _reasons(d) == ["Ready"]
    (ready,) = d.events
    assert ready.type == "Normal"
    assert ready.message == ("1.0.0 is stable and receives 100% of traffic "
                             "(first deployment, serving 43 s after it started)")
    # Its record stays in status for `kubectl arbiter history`.
    (rec,) = d.snapshot["status"]["promotion"]["history"]
    assert (rec["version"], rec["outcome"]) == ("1.0.0", "Succeeded")


def test_a_later_promotion_still_posts_each_transition():
    d = candidate_ready()
    reasons = _reasons(d)
    assert reasons[:2] == ["Ready", "PromotionStarted"] and "Promoted" in reasons
    assert d.events[1].message.startswith("Promoting 1.1.0 from 1.0.0")
    promoted = next(e for e in d.events if e.reason == "Promoted")
    assert promoted.message.startswith("1.1.0 is stable") and "first deployment" not in promoted.message


def test_a_later_candidate_deployed_event_is_kept():
    d = Driver(two_versions("1.0.0"))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.reconcile(1)
    reasons = _reasons(d)
    assert reasons[:2] == ["Ready", "PromotionStarted"] and "CandidateDeployed" in reasons, reasons
