"""spec.routing through the real planner: a pinned version is deployed and kept warm whatever the promotion of the
default does (never retired while pinned, never given Route or Service traffic by it); every live version's
ConfigMap holds the same routes (a live file: no pod restarts when they change); unpinned, the version goes the
way any other does."""

from __future__ import annotations

import json

from arbiter_operator.promotion import PromotionInputs, VersionObservation, advance
from arbiter_operator.promotion.model import PromotionHold
from support.plannerdrive import T0, Driver, two_versions

CONTEXTS = [{"header": "x-decision-context", "value": "underwriting", "version": "1.0.0"}]


def _by_kind(d: Driver, kind: str) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in d.last.children or [] if c["kind"] == kind}


def _routes(d: Driver, version: str) -> dict | None:
    cm = _by_kind(d, "ConfigMap").get(f"credit-limit--{version.replace('.', '-')}-decision")
    text = (cm or {}).get("data", {}).get("routing.json")
    return json.loads(text) if text else None


def test_a_pinned_version_stays_warm_through_a_promotion_of_the_default():
    body = two_versions("1.0.0", rollbackWindowSeconds=0)
    body["spec"]["routing"] = {"contexts": CONTEXTS}
    d = Driver(body)
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    checksum = _by_kind(d, "InferenceService")["credit-limit--1-0-0"]["spec"]["predictor"]["annotations"]
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.set_ready("1.1.0")
    d.reconcile(1)
    d.reconcile(1)
    promotion = d.snapshot["status"]["promotion"]
    assert promotion["stable"] == "1.1.0" and promotion.get("previous") is None  # no rollback window ...
    assert set(d.isvcs) == {"credit-limit--1-0-0", "credit-limit--1-1-0"}  # ... yet 1.0.0 stays: it is pinned
    assert not [x for x in d.last.deletions if x[1] == "InferenceService"]
    service = _by_kind(d, "Service")["credit-limit"]
    assert service["spec"]["selector"]["arbiter.dev/version"] == "1.1.0"  # the default moved on
    route = _by_kind(d, "Route")["credit-limit"]["spec"]
    assert route["to"]["name"] == "credit-limit--1-1-0-predictor" and "alternateBackends" not in route
    # Both versions hold the routes; the pinned one decides its own context (each runtime drops routes to itself).
    expected = {"routes": [{"header": "x-decision-context", "value": "underwriting", "version": "1.0.0",
                            "url": "http://credit-limit--1-0-0-predictor.team.svc.cluster.local",
                            "timeoutMs": d.dm().spec.decision.deadlineMs + 5000}]}
    assert _routes(d, "1.1.0") == expected and _routes(d, "1.0.0") == expected
    # routing.json is read live: not in the pods' checksum (the pinned version's pods were never rolled).
    assert _by_kind(d, "InferenceService")["credit-limit--1-0-0"]["spec"]["predictor"]["annotations"] == checksum

    del d.body["spec"]["routing"]  # unpinned: it goes like any version out of use
    d.body["metadata"]["generation"] += 1
    d.reconcile(1)
    assert ("serving.kserve.io/v1beta1", "InferenceService", "credit-limit--1-0-0") in d.last.deletions
    assert _routes(d, "1.1.0") is None


def test_pinning_a_version_never_deployed_deploys_it_once_its_artifacts_are_valid():
    body = two_versions("1.0.0")
    body["spec"]["routing"] = {"contexts": [{**CONTEXTS[0], "version": "1.1.0"}]}
    d = Driver(body)
    d.reconcile()
    assert set(d.isvcs) == {"credit-limit--1-0-0", "credit-limit--1-1-0"}
    d.set_ready("1.0.0")
    d.set_ready("1.1.0")
    d.reconcile(5)
    assert d.snapshot["status"]["promotion"]["stable"] == "1.0.0"
    assert _by_kind(d, "Service")["credit-limit"]["spec"]["selector"]["arbiter.dev/version"] == "1.0.0"


def test_a_pinned_candidate_rolled_back_stays_warm_and_the_rollback_finishes():
    def inputs(status, **kw):
        return PromotionInputs(spec=kw.pop("spec"), status=status, versions=("v1", "v2"),
                               observations=kw.pop("obs"), candidate_sla_p95_ms=None, analysis=None,
                               retry_annotation=None, generation=1, now=T0, pinned=frozenset({"v2"}), **kw)

    from arbiter_operator.api.promotion import PromoteSpec, PromotionStatus

    ready = VersionObservation(exists=True, ready=True)
    status = PromotionStatus(phase="RollingBack", stable="v1", candidate="v2", failedVersion="v2",
                             failureReason="AnalysisFailed", failureMessage="x", failedGeneration=1,
                             startedAt="2026-03-01T11:00:00Z")
    plan = advance(inputs(status, spec=PromoteSpec(version="v2"), obs={"v1": ready, "v2": ready}))
    assert plan.status.phase == "Failed" and "v2" in plan.live and plan.traffic == {"v1": 100}
    # A hold never gives a pinned version Route traffic either.
    first = advance(inputs(None, spec=PromoteSpec(version="v1"), obs={"v1": ready, "v2": ready},
                           hold=PromotionHold("AuditNotReady", "x", True)))
    assert first.traffic == {} and first.live == frozenset({"v1", "v2"})
