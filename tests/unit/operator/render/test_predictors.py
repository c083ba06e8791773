"""Why a predictor does not serve, from its pods and Deployment (plan/predictors.py), and how it reaches the
DecisionModel's status through the planner."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from arbiter_operator.plan.model import Observations, children_of
from arbiter_operator.plan.planner import plan
from arbiter_operator.plan.predictors import CRASH_LOOP, UNSCHEDULABLE, deployment_available, predictor_problem
from hypothesis import given, settings
from hypothesis import strategies as st
from support.factory import make_dm

T0 = datetime(2026, 1, 1, tzinfo=UTC)

SCHEDULER_MSG = ("0/6 nodes are available: 4 Insufficient nvidia.com/gpu, "
                 "2 node(s) didn't match Pod's node affinity/selector.")


def pending_pod(name: str, message: str = SCHEDULER_MSG) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def crashing_pod(name: str, restarts: int, reason: str = "OOMKilled", code: int = 137) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Running", "containerStatuses": [{
        "name": "kserve-container", "ready": False, "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": reason, "exitCode": code}}}]}}


def test_unschedulable_names_the_pending_pods_and_the_scheduler_message():
    problem = predictor_problem([pending_pod("p-b"), pending_pod("p-a")])
    assert problem is not None and problem.reason == UNSCHEDULABLE
    assert "2 predictor pod(s)" in problem.message and "(p-a, p-b)" in problem.message
    assert SCHEDULER_MSG in problem.message


def test_crash_loop_shows_restart_count_and_last_reason():
    problem = predictor_problem([crashing_pod("p-0", 4)])
    assert problem is not None and problem.reason == CRASH_LOOP
    assert "restarted 4 time(s)" in problem.message and "OOMKilled (exit code 137)" in problem.message
    assert problem.failed  # in back-off: it will not come up by itself


def test_starting_and_ready_pods_show_no_problem():
    running = {"metadata": {"name": "p"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "kserve-container", "ready": True, "restartCount": 0, "state": {"running": {}}}]}}
    assert predictor_problem([running, {"metadata": {"name": "q"}, "status": {"phase": "Pending"}}]) is None
    assert predictor_problem([]) is None


def test_pods_that_cannot_be_created_are_a_failed_cause():
    from arbiter_operator.plan.predictors import FAILED_CREATE, deployment_problem

    message = 'pods "p" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
    deployment = {"status": {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                             "message": message}]}}
    problem = deployment_problem(deployment)
    assert problem is not None and problem.reason == FAILED_CREATE and problem.failed
    assert message in problem.message
    assert deployment_problem({"status": {"conditions": [{"type": "Available", "status": "False"}]}}) is None


def test_deployment_available_needs_the_condition_and_a_replica():
    ok = {"status": {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}}
    assert deployment_available(ok)
    assert not deployment_available(None)
    assert not deployment_available({"status": {"availableReplicas": 0, "conditions": [
        {"type": "Available", "status": "True"}]}})
    assert not deployment_available({"status": {"availableReplicas": 1, "conditions": [
        {"type": "Available", "status": "False"}]}})


def _first_isvc(dm):
    p = plan(dm, Observations(), T0)
    return next(c for c in p.children if c["kind"] == "InferenceService")


def _serving(p):
    return next(c for c in p.status["conditions"] if c["type"] == "Serving")


def test_unschedulable_predictor_names_the_cause_on_the_decision_model():
    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    obs = Observations(children=children_of(InferenceService={name: isvc}), workloads_observed=True,
                       predictor_pods={name: (pending_pod(f"{name}-predictor-abc"),)})
    p = plan(dm, obs, T0)
    serving = _serving(p)
    assert (serving["status"], serving["reason"]) == ("False", "Unschedulable")
    assert SCHEDULER_MSG in serving["message"] and f"{name}-predictor-abc" in serving["message"]
    version = p.status["versions"][0]
    assert version["phase"] == "Deploying" and "cannot be scheduled" in version["message"]


def test_ready_needs_the_predictor_deployment_too():
    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    ready = {**isvc, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    no_deployment = plan(dm, Observations(children=children_of(InferenceService={name: ready}),
                                          workloads_observed=True), T0)
    assert _serving(no_deployment)["status"] == "False"
    assert "has no available replica" in no_deployment.status["versions"][0]["message"]
    deployment = {"metadata": {"name": f"{name}-predictor"},
                  "status": {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}}
    served = plan(dm, Observations(children=children_of(InferenceService={name: ready}), workloads_observed=True,
                                   predictor_deployments={name: deployment}), T0)
    assert _serving(served)["status"] == "True"


def test_a_deployment_not_yet_rolled_out_for_its_spec_is_not_available():
    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    ready = {**isvc, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    stale = {"metadata": {"name": f"{name}-predictor", "generation": 3},
             "status": {"observedGeneration": 2, "availableReplicas": 1,
                        "conditions": [{"type": "Available", "status": "True"}]}}
    p = plan(dm, Observations(children=children_of(InferenceService={name: ready}), workloads_observed=True,
                              predictor_deployments={name: stale}), T0)
    assert _serving(p)["status"] == "False" and "has no available replica" in p.status["versions"][0]["message"]


def test_a_serving_version_keeps_serving_while_its_deployment_picks_up_a_spec_change():
    """A scale or a rolling update of the stable version's Deployment leaves its available replicas serving: Serving
    stays True while the Deployment controller catches up (only a version still loading needs its latest spec)."""
    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    ready = {**isvc, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    rolled = {"metadata": {"name": f"{name}-predictor", "generation": 2},
              "status": {"observedGeneration": 2, "availableReplicas": 1,
                         "conditions": [{"type": "Available", "status": "True"}]}}
    first = plan(dm, Observations(children=children_of(InferenceService={name: ready}), workloads_observed=True,
                                  predictor_deployments={name: rolled}), T0)
    assert first.status["promotion"]["stable"] == dm.spec.promote.version and _serving(first)["status"] == "True"
    dm = dm.model_copy(update={"status": type(dm.status).model_validate(first.status)})
    scaling = {**rolled, "metadata": {**rolled["metadata"], "generation": 3}}
    p = plan(dm, Observations(children=children_of(InferenceService={name: ready}), workloads_observed=True,
                              predictor_deployments={name: scaling}), T0.replace(second=5))
    assert _serving(p)["status"] == "True", _serving(p)
    assert p.status["versions"][0]["phase"] == "Ready"


def test_crash_looping_predictor_fails_the_version_with_restarts_and_reason():
    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    obs = Observations(children=children_of(InferenceService={name: isvc}), workloads_observed=True,
                       predictor_pods={name: (crashing_pod(f"{name}-predictor-x", 5, "Error", 1),)})
    p = plan(dm, obs, T0)
    assert _serving(p)["reason"] == "CrashLoopBackOff"
    version = p.status["versions"][0]
    assert version["phase"] == "Failed" and "restarted 5 time(s)" in version["message"]
    assert "Error (exit code 1)" in version["message"]


def test_a_first_version_whose_pods_cannot_be_created_keeps_saying_why_once_stopped():
    """Nothing serves yet and the version is stopped with its pods: Serving still names the admission cause."""
    from arbiter_operator.plan.predictors import FAILED_CREATE

    dm = make_dm()
    isvc = _first_isvc(dm)
    name = isvc["metadata"]["name"]
    message = 'pods "p" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
    refused = {"metadata": {"name": f"{name}-predictor"}, "status": {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}]}}
    failing = plan(dm, Observations(children=children_of(InferenceService={name: isvc}), workloads_observed=True,
                                    predictor_deployments={name: refused}), T0)
    assert (_serving(failing)["reason"], failing.status["promotion"]["failureReason"]) == (FAILED_CREATE,
                                                                                        "CandidateFailed")
    assert ("serving.kserve.io/v1beta1", "InferenceService", name) in failing.deletions
    later = T0.replace(minute=1)
    for _ in range(3):  # the InferenceService and its Deployment are gone; reconciles go on
        dm = dm.model_copy(update={"status": type(dm.status).model_validate(failing.status)})
        failing = plan(dm, Observations(workloads_observed=True), later)
        serving = _serving(failing)
        assert (serving["status"], serving["reason"]) == ("False", FAILED_CREATE), serving
        assert message in serving["message"], serving
    assert failing.status["promotion"]["phase"] == "Failed"


# Hostile peers: whatever the apiserver hands back for a pod (missing fields, wrong types where Kubernetes allows
# none, nulls), the function answers with None or a problem, never an exception.
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 10), st.text(max_size=8))
pod_like = st.recursive(
    st.dictionaries(st.sampled_from(["metadata", "status", "name", "conditions", "containerStatuses", "type",
                                     "reason", "message", "state", "waiting", "lastState", "terminated",
                                     "restartCount", "ready", "exitCode", "deletionTimestamp", "status"]),
                    json_scalar, max_size=5),
    lambda inner: st.dictionaries(st.sampled_from(["metadata", "status", "conditions", "containerStatuses",
                                                   "state", "waiting", "lastState", "terminated"]),
                                  st.one_of(inner, st.lists(inner, max_size=3)), max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(pod_like, st.builds(crashing_pod, st.text(min_size=1, max_size=5), st.integers(0, 9)),
                          st.builds(pending_pod, st.text(min_size=1, max_size=5), st.text(max_size=40))),
                max_size=4))
def test_hostile_pod_status_never_raises(pods):
    try:
        problem = predictor_problem(pods)
    except (AttributeError, TypeError, ValueError) as exc:  # pragma: no cover - the assertion below explains
        raise AssertionError(f"predictor_problem raised {exc!r} on {pods!r}") from exc
    assert problem is None or problem.reason in (UNSCHEDULABLE, CRASH_LOOP)


def test_a_predictor_deployment_left_by_a_deleted_inferenceservice_is_not_counted():
    # A retried version: KServe's new InferenceService has the old name, the old Deployment (still available) waits
    # for the garbage collector. Only the Deployment owned by the live InferenceService's uid counts.
    from arbiter_operator.observe.children import _belongs_to

    isvc = {"metadata": {"name": "credit--1-1-0", "uid": "new-uid"}}
    left_over = {"metadata": {"name": "credit--1-1-0-predictor",
                              "ownerReferences": [{"kind": "InferenceService", "uid": "old-uid"}]}}
    current = {"metadata": {"name": "credit--1-1-0-predictor",
                            "ownerReferences": [{"kind": "InferenceService", "uid": "new-uid"}]}}
    assert not _belongs_to(left_over, isvc)
    assert _belongs_to(current, isvc)
    assert not _belongs_to({"metadata": {"name": "credit--1-1-0-predictor"}}, isvc)
