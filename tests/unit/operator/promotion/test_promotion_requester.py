"""Who promoted: the field manager that wrote spec.promote.version, Argo CD's revision and the generation, read by the
pass that starts a promotion (never by a converged one) and kept in status.promotion and its history record."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from arbiter_operator.observe.requester import application_of, promote_writer, synced_revision
from arbiter_operator.plan import plan
from arbiter_operator.promotion.model import PromotionRequest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.plannerdrive import Driver, two_versions


def _entry(manager: Any, time: str, promote: bool = True, **fields: Any) -> dict[str, Any]:
    spec = {"f:promote": {"f:version": {}}} if promote else {"f:decision": {}}
    return {"manager": manager, "operation": "Update", "time": time, "fieldsV1": {"f:spec": spec, **fields}}


def test_the_last_writer_of_promote_version_is_the_requester():
    obj = {"metadata": {"managedFields": [
        _entry("argocd-controller", "2026-03-01T10:00:00Z"),
        _entry("kubectl-arbiter", "2026-03-01T11:00:00Z"),
        _entry("kubectl-edit", "2026-03-01T12:00:00Z", promote=False),  # wrote something else, later
        {"manager": "arbiter-operator", "operation": "Update", "subresource": "status", "time": "2026-03-01T13:00:00Z",
         "fieldsV1": {"f:status": {}}},
    ]}}
    assert promote_writer(obj) == "kubectl-arbiter"
    assert promote_writer({"metadata": {}}) is None


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                        max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values, json_values)
def test_hostile_managed_fields_and_applications_never_raise(managed, app):
    # Whatever the apiserver (or whoever wrote the Application's status) sends: an answer or None, never an error.
    writer = promote_writer({"metadata": {"managedFields": managed}})
    assert writer is None or (isinstance(writer, str) and len(writer) <= 128)
    rev = synced_revision(app if isinstance(app, dict) else {"status": app})
    assert rev is None or (isinstance(rev, str) and 0 < len(rev) <= 256)


def test_the_application_is_found_from_the_tracking_annotation():
    key = "argocd.argoproj.io/tracking-id"
    tracking = "credit-models:arbiter.dev/DecisionModel:team/credit-limit"
    assert application_of({key: tracking}, "openshift-gitops") == ("openshift-gitops", "credit-models")
    assert application_of({key: tracking}, None) is None  # Argo CD's namespace unknown: not read
    assert application_of({key: "team-apps_credit:arbiter.dev/DecisionModel:team/credit-limit"}, None) == (
        "team-apps", "credit")
    assert application_of({}, "argocd") is None
    app = {"status": {"sync": {"revision": "old"},
                      "operationState": {"operation": {"sync": {"revision": "running"}},
                                         "syncResult": {"revision": "abc123"}}}}
    assert synced_revision(app) == "abc123"
    assert synced_revision({"status": {"sync": {"revisions": ["a1", "b2"]}}}) == "a1,b2"


class AskingDriver(Driver):
    """The planner driven as the reconcile drives it: a plan that starts a promotion without knowing who asked
    (needs_request) is made again with who asked (`self.asker`), and the reads are counted."""

    asker = PromotionRequest()
    reads = 0
    _request: PromotionRequest | None = None

    def observations(self, analysis):
        return dataclasses.replace(super().observations(analysis), promotion_request=self._request)

    def reconcile(self, after: float = 0, analysis=None):
        self.now += timedelta(seconds=after)
        self._request = None
        if plan(self.dm(), self.observations(analysis), self.now).needs_request:
            self.reads += 1
            self._request = self.asker
        return super().reconcile(0, analysis)


def test_a_pass_that_starts_a_promotion_asks_who_and_the_history_keeps_it():
    d = AskingDriver(two_versions("1.0.0"))
    d.asker = PromotionRequest(by="kubectl-client-side-apply")
    d.reconcile()
    assert d.reads == 1 and not d.last.needs_request  # the first deployment starts: who asked is read once
    assert d.snapshot["status"]["promotion"]["requestedBy"] == "kubectl-client-side-apply"
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.reconcile(5)
    assert d.reads == 1  # passes that start nothing read nothing
    (rec,) = d.snapshot["status"]["promotion"]["history"]
    assert (rec["requestedBy"], rec.get("revision"), rec["generation"]) == ("kubectl-client-side-apply", None, 1)

    d.edit_spec(version="1.1.0")  # generation 2, synced by Argo CD at commit abc123
    d.asker = PromotionRequest(by="argocd-controller", revision="abc123")
    d.reconcile(1)
    assert d.reads == 2
    d.set_ready("1.1.0")
    d.reconcile(1)
    last = d.snapshot["status"]["promotion"]["history"][-1]
    assert last["version"] == "1.1.0" and last["outcome"] == "Succeeded"
    assert (last["requestedBy"], last["revision"], last["generation"]) == ("argocd-controller", "abc123", 2)

    d.edit_spec(version="1.0.0")  # back to the still-warm 1.0.0: a warm switch names who asked too
    d.asker = PromotionRequest(by="kubectl-arbiter")
    d.reconcile(1)
    last = d.snapshot["status"]["promotion"]["history"][-1]
    assert (last["reason"], last["requestedBy"], last["generation"]) == ("WarmSwitch", "kubectl-arbiter", 3)


def test_a_promotion_asked_for_in_the_second_the_first_version_began_serving_still_names_who_asked():
    # startedAt has a second's resolution: the new promotion starts at the same time as the first deployment did.
    d = AskingDriver(two_versions("1.0.0"))
    d.asker = PromotionRequest(by="kubectl-client-side-apply")
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(0)
    d.edit_spec(version="1.1.0")
    d.asker = PromotionRequest(by="release-pipeline")
    d.reconcile(0)
    assert d.reads == 2 and d.snapshot["status"]["promotion"]["requestedBy"] == "release-pipeline"
    d.set_ready("1.1.0")
    d.reconcile(1)
    last = d.snapshot["status"]["promotion"]["history"][-1]
    assert (last["version"], last["outcome"], last["requestedBy"]) == ("1.1.0", "Succeeded", "release-pipeline")
