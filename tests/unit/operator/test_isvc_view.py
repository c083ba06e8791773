"""Which InferenceService changes wake its DecisionModel (handlers.isvc_view): KServe's verdict and what drift is
judged on do; KServe's own bookkeeping while a predictor comes up does not."""

from __future__ import annotations

import copy

from arbiter_operator.handlers import isvc_view


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
