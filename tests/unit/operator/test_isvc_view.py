"""Which InferenceService changes wake its DecisionModel (triggers.isvc_view): KServe's verdict and what drift is
judged on do; KServe's own bookkeeping while a predictor comes up does not."""

from __future__ import annotations

import copy

from arbiter_operator.kube.kinds import CACHED
from arbiter_operator.triggers import isvc_view
from hypothesis import given, settings
from hypothesis import strategies as st


def _isvc() -> dict:
    return {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "credit-limit--1-0-0", "namespace": "risk", "generation": 1, "resourceVersion": "10",
                     "labels": {"arbiter.dev/decision-model": "credit-limit"},
                     "annotations": {"arbiter.dev/applied-hash": "abc"},
                     "ownerReferences": [{"kind": "DecisionModel", "name": "credit-limit", "uid": "u1"}],
                     "managedFields": [{"manager": "kserve", "time": "2026-12-01T00:00:00Z"}]},
        "spec": {"predictor": {"model": {"runtime": "credit-limit-runtime"}}},
        "status": {"conditions": [{"type": "PredictorReady", "status": "False"},
                                  {"type": "Ready", "status": "False", "reason": "PredictorNotReady"}],
                   "modelStatus": {"transitionStatus": "InProgress", "states": {"activeModelState": "Pending"}}},
    }


def _changed(edit) -> bool:
    before = _isvc()
    after = copy.deepcopy(before)
    edit(after)
    return isvc_view(before) != isvc_view(after)


def test_kserve_bookkeeping_wakes_nothing():
    def bookkeeping(o):
        o["metadata"]["resourceVersion"] = "11"
        o["metadata"]["managedFields"][0]["time"] = "2026-12-01T00:00:05Z"
        o["status"]["conditions"][0] = {"type": "PredictorReady", "status": "True"}
        o["status"]["conditions"].append({"type": "IngressReady", "status": "True"})
        o["status"]["url"] = "http://credit-limit--1-0-0.risk.svc"
        o["status"]["components"] = {"predictor": {"latestCreatedRevision": "r1"}}
        o["status"]["modelStatus"]["states"]["activeModelState"] = "Loading"
        o["status"]["observedGeneration"] = 1

    assert not _changed(bookkeeping)


def test_the_verdict_and_drift_wake_the_decision_model():
    def ready(o):
        o["status"]["conditions"][1] = {"type": "Ready", "status": "True"}

    def failed(o):
        o["status"]["modelStatus"] = {"transitionStatus": "BlockedByFailedLoad",
                                      "lastFailureInfo": {"message": "out of memory"}}

    def new_message(o):
        o["status"]["conditions"][1]["message"] = "predictor pods are pending"

    def spec_edited(o):
        o["metadata"]["generation"] = 2

    def label_removed(o):
        o["metadata"]["labels"] = {}

    def annotation_edited(o):
        o["metadata"]["annotations"]["arbiter.dev/applied-hash"] = "edited"

    def owner_changed(o):
        o["metadata"]["ownerReferences"] = []

    def deleting(o):
        o["metadata"]["deletionTimestamp"] = "2026-12-01T00:01:00Z"

    for edit in (ready, failed, new_message, spec_edited, label_removed, annotation_edited, owner_changed, deleting):
        assert _changed(edit), edit.__name__


def test_a_view_wakes_once_per_change_and_on_a_deletion_of_what_it_held():
    from arbiter_operator.triggers import LastSeen

    seen = LastSeen(lambda o: o.get("status", {}).get("trouble"))  # None: nothing to report (a healthy pod)

    def ev(type_, trouble=None):
        return {"type": type_, "object": {"metadata": {"namespace": "risk", "name": "p"},
                                          "status": {"trouble": trouble}}}

    assert not seen.changed(ev("ADDED"))  # healthy from the start: nothing to wake for
    assert seen.changed(ev("MODIFIED", "CrashLoopBackOff"))
    assert not seen.changed(ev("MODIFIED", "CrashLoopBackOff"))  # the same trouble again
    assert seen.changed(ev("MODIFIED"))  # recovered
    assert not seen.changed(ev("DELETED"))  # a healthy pod going away changes nothing read
    assert seen.changed(ev("ADDED", "Unschedulable"))
    assert seen.changed(ev("DELETED"))  # a pod in trouble going away does


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(status=_json, metadata=_json, conditions=st.lists(_json, max_size=3), model_status=_json)
def test_an_inference_service_of_any_shape_gets_a_view(status, metadata, conditions, model_status):
    """Whatever KServe (or anybody) writes, the watch event is judged, never dropped on an exception: an object
    whose view cannot be read wakes its DecisionModel, and the reconcile reports what is wrong."""
    from arbiter_operator.triggers import LastSeen

    obj = {"metadata": metadata, "status": status}
    if isinstance(status, dict):
        status["conditions"] = [*conditions, {"type": "Ready", "status": status.get("x")}]
        status["modelStatus"] = model_status
    isvc_view(obj)
    assert LastSeen(isvc_view).changed({"type": "MODIFIED", "object": obj}) in (True, False)


@settings(max_examples=300, deadline=None)
@given(status=_json, metadata=_json, conditions=st.lists(_json, max_size=3))
def test_a_predictor_deployment_or_pod_of_any_shape_gets_a_view(status, metadata, conditions):
    """The same for the predictor Deployments and pods: a view of any object, so no watch event is lost."""
    from arbiter_operator.triggers import LastSeen, availability, replica_failure, trouble

    if isinstance(status, dict):
        status["conditions"] = conditions
    obj = {"metadata": metadata, "status": status}
    for seen in (LastSeen(availability), LastSeen(replica_failure), LastSeen(trouble)):
        assert seen.changed({"type": "MODIFIED", "object": obj}) in (True, False)
        assert seen.changed({"type": "DELETED", "object": obj}) in (True, False)


def _deployment(available: bool, failure: str | None = None, observed: int = 1) -> dict:
    conditions = [{"type": "Available", "status": "True" if available else "False"}]
    if failure:
        conditions.append({"type": "ReplicaFailure", "status": "True", "message": failure})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "credit-limit--1-0-0-predictor", "namespace": "risk", "generation": 1,
                         "resourceVersion": "20", "uid": "d1",
                         "labels": {"serving.kserve.io/inferenceservice": "credit-limit--1-0-0"}},
            "status": {"observedGeneration": observed, "availableReplicas": 1 if available else 0,
                       "conditions": conditions}}


def test_a_predictor_deployment_wakes_its_decision_model_when_a_pass_would_report_it():
    """Replicas coming up before KServe's Ready change nothing a pass reports (KServe's Ready wakes the
    DecisionModel when it comes); after KServe's Ready they decide readiness, and pods that cannot be created are
    reported at once."""
    from arbiter_operator.kube.cache import WatchCache
    from arbiter_operator.triggers import Triggers

    woken: list[tuple[str, str]] = []

    class Queue:
        def add(self, key, urgent=False):
            assert urgent, "a predictor's serving state moved: the urgent lane"
            woken.append(key)

    cache = WatchCache(CACHED)
    triggers = Triggers(Queue(), cache)
    isvc = _isvc()
    isvc["metadata"]["namespace"] = "risk-deployments"

    def isvc_event(type_, obj):  # as the watch delivers it: into the cache, then judged
        cache.put(obj)
        triggers.child_event({"type": type_, "object": obj}, "risk-deployments")
        woken.clear()  # KServe's verdict wakes its DecisionModel too (another test's subject); here: the Deployment's

    def deployment_event(type_, obj):
        obj["metadata"]["namespace"] = "risk-deployments"
        triggers.deployment_event({"type": type_, "object": obj}, "risk-deployments")
        return woken.pop() if woken else None

    isvc_event("ADDED", isvc)

    assert deployment_event("ADDED", _deployment(False, observed=0)) is None
    assert deployment_event("MODIFIED", _deployment(False)) is None  # the controller caught up: still not Ready
    assert deployment_event("MODIFIED", _deployment(True)) is None  # available, but KServe has not said Ready
    assert deployment_event("MODIFIED", _deployment(False, "pods forbidden: violates PodSecurity")) == (
        "risk-deployments", "credit-limit")  # cannot create pods: reported whatever KServe says
    assert deployment_event("MODIFIED", _deployment(False)) == (
        "risk-deployments", "credit-limit")  # the failure cleared
    ready = copy.deepcopy(isvc)
    ready["metadata"]["resourceVersion"] = "11"
    ready["status"]["conditions"][1] = {"type": "Ready", "status": "True"}
    isvc_event("MODIFIED", ready)
    assert deployment_event("MODIFIED", _deployment(True)) == ("risk-deployments", "credit-limit")  # now it decides
    assert deployment_event("MODIFIED", _deployment(True)) is None  # nothing it reads changed
    assert deployment_event("DELETED", _deployment(True)) == ("risk-deployments", "credit-limit")


def test_kserves_own_objects_with_the_operators_label_wake_nothing():
    """KServe's predictor Service inherits the InferenceService's labels, the operator's among them; it is KServe's,
    and a pass reads nothing of it. The operator's own Service does wake its DecisionModel when someone edits it."""
    from arbiter_operator.triggers import kserves

    def service(owner_kind: str) -> dict:
        return {"type": "ADDED", "object": {"metadata": {"ownerReferences": [
            {"kind": owner_kind, "name": "x", "uid": "u", "controller": True}]}}}

    assert kserves(service("InferenceService"))
    assert not kserves(service("DecisionModel"))
    assert not kserves({"type": "ADDED", "object": {"metadata": {"ownerReferences": "garbage"}}})


def test_kserves_verdict_wakes_its_decision_model_in_the_urgent_lane_and_other_drift_in_the_ordinary_one():
    """A version KServe has just made ready (or failed) is reconciled ahead of a fleet's first passes
    (kube/workqueue.py); an edit of the operator's Route waits its turn."""
    from arbiter_operator.kube.cache import WatchCache
    from arbiter_operator.kube.workqueue import PriorityWorkQueue
    from arbiter_operator.triggers import Triggers

    queue = PriorityWorkQueue()
    triggers = Triggers(queue, WatchCache(CACHED))
    isvc = _isvc()
    isvc["metadata"]["namespace"] = "risk-urgent"
    triggers.child_event({"type": "ADDED", "object": isvc}, "risk-urgent")
    assert queue._pending == {("risk-urgent", "credit-limit"): True}
    queue._pending.clear()

    route = {"apiVersion": "route.openshift.io/v1", "kind": "Route",
             "metadata": {"name": "credit-limit", "namespace": "risk-urgent", "resourceVersion": "30",
                          "labels": {"arbiter.dev/decision-model": "credit-limit"}}, "spec": {"to": {"name": "x"}}}
    triggers.child_event({"type": "MODIFIED", "object": route}, "risk-urgent")
    assert queue._pending == {("risk-urgent", "credit-limit"): False}

    ready = copy.deepcopy(isvc)
    ready["metadata"]["resourceVersion"] = "11"
    ready["status"]["conditions"][1] = {"type": "Ready", "status": "True"}
    triggers.child_event({"type": "MODIFIED", "object": ready}, "risk-urgent")
    assert queue._pending == {("risk-urgent", "credit-limit"): True}  # moved ahead
