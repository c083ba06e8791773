"""The approval annotation is free text anyone with patch rights on the DecisionModel can set: whatever it says,
the promotion never crashes, and it leaves Paused only for a value that names the waiting candidate."""

from __future__ import annotations

from datetime import timedelta

from arbiter_operator.api.promotion import approves
from hypothesis import given, settings
from hypothesis import strategies as st
from support.plannerdrive import candidate_ready

HOSTILE = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["1.1.0", "1.1.0@", "1.1.0@now", "1.1.00", "1.1", "1.0.0", "1.0.0@x", "@1.1.0", " 1.1.0",
                     "1.1.0 "]),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


@given(HOSTILE, st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.text(max_size=20)))
def test_approves_only_a_fresh_value_that_names_the_candidate(annotation, candidate, consumed):
    ok = approves(annotation, candidate, consumed)
    if ok:
        assert candidate is not None and annotation != consumed
        assert annotation == candidate or annotation.startswith(candidate + "@")
    elif candidate and annotation and annotation != consumed:
        assert annotation != candidate and not annotation.startswith(candidate + "@")


def _paused():  # type: ignore[no-untyped-def]
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}], approval="Required",
                        analysis={"intervalSeconds": 60, "minRequests": 50})
    d.now += timedelta(seconds=60)
    s = d.reconcile(0, d.analysis(0.05, 0, 500))
    assert s["status"]["promotion"]["phase"] == "Paused"
    return d


@settings(max_examples=40, deadline=None)
@given(HOSTILE)
def test_a_hostile_approval_value_never_crashes_and_only_the_candidate_name_resumes(value):
    d = _paused()
    d.body["metadata"]["annotations"] = {"arbiter.dev/approve": value}
    phase = d.reconcile(1)["status"]["promotion"]["phase"]
    if value == "1.1.0" or value.startswith("1.1.0@"):
        assert phase != "Paused"
    else:
        assert phase == "Paused"
