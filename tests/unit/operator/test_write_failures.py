"""A failed child write shows on Reconciling (plan/writes.py), whatever the apiserver answered; Ready is left as the
plan computed it."""

from __future__ import annotations

from datetime import UTC, datetime

from arbiter_operator.plan.writes import CHILD_WRITE_REFUSED, MESSAGE_LIMIT, WriteFailure, with_write_failures
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = datetime(2026, 1, 1, tzinfo=UTC)
READY = {"type": "Ready", "status": "True", "reason": "Promoted", "message": "1.0.0 receives 100% of traffic",
         "observedGeneration": 3, "lastTransitionTime": "2025-12-31T00:00:00Z"}
RECONCILING = {**READY, "type": "Reconciling", "status": "False"}
DENIED = 'admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request: nope'


def _conds(status):
    return {c["type"]: c for c in status["conditions"]}


def test_a_refused_write_names_the_object_and_the_answer_and_leaves_ready_alone():
    failure = WriteFailure("apply", "InferenceService", "team", "credit-limit--1-1-0", 500, DENIED)
    out = _conds(with_write_failures({"conditions": [READY, RECONCILING]}, [failure], 3, T0))
    assert out["Ready"] == READY
    rec = out["Reconciling"]
    assert (rec["status"], rec["reason"]) == ("True", CHILD_WRITE_REFUSED)
    assert "InferenceService team/credit-limit--1-1-0" in rec["message"] and DENIED in rec["message"]
    assert "within a minute" in rec["message"]


def test_an_unanswered_write_says_so_and_a_refusal_outweighs_it():
    down = WriteFailure("apply", "Route", "team", "credit-limit", 503, "the server is currently unable to handle it")
    refused = WriteFailure("apply", "ConfigMap", "team", "cm", 422, 'ConfigMap "cm" is invalid: data: Too long')
    assert _conds(with_write_failures({"conditions": []}, [down], 1, T0))["Reconciling"]["reason"] == (
        "ApiserverUnavailable")
    both = _conds(with_write_failures({"conditions": []}, [down, refused], 1, T0))["Reconciling"]
    assert both["reason"] == CHILD_WRITE_REFUSED and "Route team/credit-limit" in both["message"]


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=MESSAGE_LIMIT + 1, max_size=5000), st.lists(st.integers(0, 9), min_size=1, max_size=20))
def test_whatever_the_apiserver_says_the_message_stays_short(said, names):
    failures = [WriteFailure("apply", "ConfigMap", "ns", f"cm-{n}", 422, said) for n in names]
    msg = _conds(with_write_failures({"conditions": []}, failures, 1, T0))["Reconciling"]["message"]
    assert len(msg) < 4 * (MESSAGE_LIMIT + 120)
    assert ("more" in msg) == (len(failures) > 3)
