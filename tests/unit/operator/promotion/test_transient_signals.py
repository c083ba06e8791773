"""An outage is not a verdict: what is transient (KServe's webhooks unreachable, the apiserver timing out, a full
quota) holds a promotion and names the cause; only the candidate's own failure, or a refusal no retry changes, fails
it (plan/signals.py, through plan/predictors.py and the planner)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from arbiter_operator.plan import Observations
from arbiter_operator.plan.predictors import FAILED_CREATE, IMAGE_PULL, deployment_problem, predictor_problem
from arbiter_operator.plan.signals import (
    APISERVER_UNAVAILABLE,
    QUOTA_EXCEEDED,
    WEBHOOK_UNAVAILABLE,
    classify_message,
    classify_status,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from support.plannerdrive import Driver, two_versions

WEBHOOK_DOWN = ('Internal error occurred: failed calling webhook "inferenceservice.kserve-webhook-server.pod-mutator":'
                ' failed to call webhook: Post "https://127.0.0.1:9443/mutate-pods?timeout=10s": context deadline '
                'exceeded')
POD_SECURITY = 'pods "p" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
QUOTA = 'pods "p" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: 4, limited: 4'
DENIED = ('admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request: '
          'the InferenceService "x" is invalid')


def _failed_create(message: str) -> dict[str, Any]:
    return {"status": {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}]}}


def test_the_table():
    down = classify_message(WEBHOOK_DOWN, FAILED_CREATE)
    assert down.transient and down.reason == WEBHOOK_UNAVAILABLE
    assert classify_message(QUOTA, FAILED_CREATE).reason == QUOTA_EXCEEDED
    assert classify_message(QUOTA, FAILED_CREATE).transient
    assert not classify_message(POD_SECURITY, FAILED_CREATE).transient
    assert classify_message(POD_SECURITY, FAILED_CREATE).reason == FAILED_CREATE
    assert classify_message("etcdserver: request timed out", "x").reason == APISERVER_UNAVAILABLE
    # Answers: a refusal is permanent even as a 500; no answer, 429 and 5xx are transient; other 4xx are refusals.
    assert not classify_status(500, DENIED, "ChildWriteRefused").transient
    assert classify_status(500, WEBHOOK_DOWN, "ChildWriteRefused").reason == WEBHOOK_UNAVAILABLE
    assert classify_status(503, "", "ChildWriteRefused").transient
    assert classify_status(429, "slow down", "ChildWriteRefused").transient
    assert classify_status(None, "", "ChildWriteRefused").transient
    assert classify_status(422, 'InferenceService "x" is invalid', "ChildWriteRefused").reason == "ChildWriteRefused"
    assert not classify_status(403, "forbidden", "ChildWriteRefused").transient


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80), st.sampled_from([None, 400, 403, 409, 422, 429, 500, 502, 503]))
def test_a_refusal_is_never_an_outage_whatever_surrounds_it(before, after, code):
    message = before + " denied the request: " + after
    assert not classify_message(message, "R").transient
    assert not classify_status(code, message, "R").transient


def test_pods_that_a_down_webhook_keeps_from_being_created_are_held_not_failed():
    problem = deployment_problem(_failed_create(WEBHOOK_DOWN))
    assert problem is not None and problem.transient and not problem.failed
    assert problem.reason == WEBHOOK_UNAVAILABLE and WEBHOOK_DOWN in problem.message
    refused = deployment_problem(_failed_create(POD_SECURITY))
    assert refused is not None and refused.failed and refused.reason == FAILED_CREATE


def test_an_image_that_cannot_be_pulled_is_the_candidates_own_failure_once_the_kubelet_backs_off():
    def pod(reason: str) -> dict[str, Any]:
        return {"metadata": {"name": "p"}, "status": {"containerStatuses": [{
            "name": "kserve-container", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": "manifest unknown"}}}]}}
    backoff = predictor_problem([pod("ImagePullBackOff")])
    assert backoff is not None and backoff.reason == IMAGE_PULL and backoff.failed
    first = predictor_problem([pod("ErrImagePull")])
    assert first is not None and not first.failed


class Workloads(Driver):
    """The planner driver with the candidate's predictor Deployment observed (what KServe made)."""

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.deployments: dict[str, dict[str, Any]] = {}

    def observations(self, analysis: Any) -> Observations:
        ready = {"status": {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}}
        deployments = {n: self.deployments.get(n, ready) for n in self.isvcs}
        return replace(super().observations(analysis), workloads_observed=True, predictor_deployments=deployments)

    def status_after(self, after: float = 0) -> dict[str, Any]:
        """The DecisionModel's status after one more pass, `after` seconds on."""
        return self.reconcile(after)["status"]


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def _stable_then_candidate_down(deadline: int = 600) -> Workloads:
    d = Workloads(two_versions("1.0.0", progressDeadlineSeconds=deadline))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    candidate = next(n for n in d.isvcs if n.endswith("1-1-0"))
    d.deployments[candidate] = _failed_create(WEBHOOK_DOWN)
    return d


def test_a_webhook_outage_during_pod_creation_holds_the_promotion_then_it_completes():
    d = _stable_then_candidate_down()
    candidate = next(n for n in d.isvcs if n.endswith("1-1-0"))
    for _ in range(5):  # the outage lasts: every pass holds
        status = d.status_after(30)
        assert status["promotion"]["phase"] == "Waiting" and status["promotion"].get("failureReason") is None
        assert candidate in d.isvcs and not d.last.deletions
        c = _conditions(status)
        assert c["Reconciling"][:2] == ("True", WEBHOOK_UNAVAILABLE) and c["Stalled"][0] == "False"
        assert "failed calling webhook" in c["Reconciling"][2] and "progress deadline" in c["Reconciling"][2]
        assert c["Serving"][0] == "True"  # the stable version serves throughout
    assert not [e for e in d.events if e.type == "Warning" and e.reason == "CandidateFailed"]
    del d.deployments[candidate]  # KServe is back: the ReplicaSet creates the pods, the version loads
    d.set_ready("1.1.0")
    status = d.status_after(10)
    assert status["promotion"]["stable"] == "1.1.0", status["promotion"]
    assert [r["outcome"] for r in status["promotion"]["history"]][-1] == "Succeeded"


def test_an_outage_that_outlasts_the_progress_deadline_ends_it_and_says_what_held_it():
    d = _stable_then_candidate_down(deadline=60)
    d.reconcile(30)
    status = d.status_after(40)
    assert status["promotion"]["phase"] in ("RollingBack", "Failed")
    assert status["promotion"]["failureReason"] == "ProgressDeadlineExceeded"
    assert WEBHOOK_UNAVAILABLE in status["promotion"]["failureMessage"]
    assert "failed calling webhook" in status["promotion"]["failureMessage"]


def test_a_refused_pod_still_fails_the_candidate_at_once():
    d = _stable_then_candidate_down()
    candidate = next(n for n in d.isvcs if n.endswith("1-1-0"))
    d.deployments[candidate] = _failed_create(POD_SECURITY)
    status = d.status_after(1)
    assert status["promotion"]["failureReason"] == "CandidateFailed"
