"""spec.audit without a cluster: S3's bucket answers read back exactly or refused by name, the AuditReady verdict for
every state a bucket can be in, the runtime's settings rendered (credentials by reference only), and a required audit
that is not ready holding the promotion: a first version does not serve, a candidate is not promoted, and both go on
by themselves once it is ready."""

from __future__ import annotations

import copy

import pytest
from arbiter_operator.api.conditions import AUDIT_READY, make_condition
from arbiter_operator.api.models import AuditSpec, DecisionModel
from arbiter_operator.clients.s3_xml import MalformedAnswer, ObjectLock, parse_object_lock, parse_versioning
from arbiter_operator.plan.audit import BucketState, judge_bucket, promotion_hold
from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice
from hypothesis import given, settings
from hypothesis import strategies as st
from support.plannerdrive import T0, Driver, two_versions

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
AUDIT = {"s3": {"bucket": "decisions-audit", "prefix": "credit", "secretName": "audit-s3",
                "endpoint": "https://s3.example.com", "region": "eu-west-1"},
         "retention": {"mode": "COMPLIANCE", "days": 2557}}


def _lock_xml(enabled: bool, mode: str | None = None, days: int | None = None, years: int | None = None) -> bytes:
    rule = ""
    if mode:
        period = f"<Days>{days}</Days>" if days is not None else f"<Years>{years}</Years>"
        rule = f"<Rule><DefaultRetention><Mode>{mode}</Mode>{period}</DefaultRetention></Rule>"
    on = "<ObjectLockEnabled>Enabled</ObjectLockEnabled>" if enabled else ""
    return f'<ObjectLockConfiguration xmlns="{NS}">{on}{rule}</ObjectLockConfiguration>'.encode()


def test_bucket_answers_read_back():
    assert parse_versioning(f'<VersioningConfiguration xmlns="{NS}"><Status>Enabled</Status>'
                            "</VersioningConfiguration>".encode()) == "Enabled"
    assert parse_versioning(f'<VersioningConfiguration xmlns="{NS}"/>'.encode()) == ""
    assert parse_object_lock(_lock_xml(True, "COMPLIANCE", days=30)) == ObjectLock(True, "COMPLIANCE", 30)
    assert parse_object_lock(_lock_xml(True, "GOVERNANCE", years=7)) == ObjectLock(True, "GOVERNANCE", 7 * 365)
    assert parse_object_lock(_lock_xml(False)) == ObjectLock(False)
    for bad in (b"<Error><Code>x</Code></Error>", b"<ObjectLockConfiguration><Rule><DefaultRetention><Mode>FOREVER"
                b"</Mode></DefaultRetention></Rule></ObjectLockConfiguration>",
                b"<ObjectLockConfiguration><Rule><DefaultRetention><Days>-1</Days></DefaultRetention></Rule>"
                b"</ObjectLockConfiguration>"):
        with pytest.raises(MalformedAnswer):
            parse_object_lock(bad)


@settings(max_examples=400)
@given(body=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_are_a_bucket_answer_or_refused_by_name(body):
    for parse in (parse_versioning, parse_object_lock):
        try:
            parse(body)
        except MalformedAnswer as exc:
            assert 0 < len(str(exc)) < 200


SPEC = AuditSpec.model_validate(AUDIT)


@pytest.mark.parametrize(("state", "status", "reason"), [
    (None, "False", "BucketMissing"),
    (BucketState("", False), "False", "VersioningOff"),
    (BucketState("Suspended", False), "False", "VersioningOff"),
    (BucketState("Enabled", False), "False", "ObjectLockOff"),
    (BucketState("Enabled", True, "GOVERNANCE", 3000), "False", "RetentionShorterThanAsked"),  # weaker mode
    (BucketState("Enabled", True, "COMPLIANCE", 365), "False", "RetentionShorterThanAsked"),  # fewer days
    (BucketState("Enabled", True, "COMPLIANCE", 2557), "True", "BucketReady"),
    (BucketState("Enabled", True), "True", "BucketReady"),  # no default: every object has its own lock
])
def test_the_verdict_names_what_is_missing(state, status, reason):
    verdict = judge_bucket(SPEC, state)
    assert (verdict.status, verdict.reason) == (status, reason), verdict.message
    assert "decisions-audit" in verdict.message


def test_without_retention_any_bucket_that_exists_will_do():
    spec = AuditSpec.model_validate({"s3": AUDIT["s3"]})
    assert judge_bucket(spec, BucketState("", False)).status == "True"
    assert judge_bucket(spec, None).reason == "BucketMissing"


@pytest.mark.parametrize("audit", [
    {**AUDIT, "retention": {"mode": "FOREVER", "days": 1}},
    {**AUDIT, "retention": {"mode": "COMPLIANCE", "days": 0}},
    {**AUDIT, "s3": {**AUDIT["s3"], "bucket": "Not_A_Bucket"}},
    {**AUDIT, "s3": {**AUDIT["s3"], "prefix": "/leading"}},
])
def test_a_malformed_audit_is_refused(audit):
    body = two_versions()
    body["spec"]["audit"] = audit
    with pytest.raises(ValueError):
        DecisionModel.model_validate(body)


def test_the_runtime_gets_the_bucket_and_the_lock_and_the_credentials_by_reference():
    body = two_versions()
    body["spec"]["audit"] = copy.deepcopy(AUDIT)
    dm = DecisionModel.model_validate(body)
    version = dm.spec.versions[0]
    isvc = render_inferenceservice(PredictorInputs(dm=dm, version=version, configmap=render_configmap(dm, version),
                                                   namespace_labels={}))
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in isvc["spec"]["predictor"]["model"]["env"]}
    assert {k: v for k, v in env.items() if k.startswith("ARBITER_AUDIT")} == {
        "ARBITER_AUDIT_S3_BUCKET": "decisions-audit", "ARBITER_AUDIT_S3_PREFIX": "credit",
        "ARBITER_AUDIT_S3_ENDPOINT": "https://s3.example.com", "ARBITER_AUDIT_S3_REGION": "eu-west-1",
        "ARBITER_AUDIT_S3_RETENTION_DAYS": "2557", "ARBITER_AUDIT_S3_LOCK_MODE": "COMPLIANCE"}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "audit-s3", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "audit-s3", "key": "AWS_SECRET_ACCESS_KEY"}}


def _audit_condition(status: str, reason: str = "ObjectLockOff"):
    return make_condition(AUDIT_READY, status, reason, "bucket decisions-audit has no object lock", 1, T0)


def test_only_a_required_audit_that_is_not_ready_holds():
    assert promotion_hold(None, None) is None
    assert promotion_hold(SPEC, _audit_condition("True", "BucketReady")) is None
    assert promotion_hold(SPEC.model_copy(update={"required": False}), _audit_condition("False")) is None
    assert promotion_hold(SPEC, _audit_condition("False")).stalled  # a person must fix the bucket
    assert not promotion_hold(SPEC, _audit_condition("Unknown", "AuditStorageUnreachable")).stalled


class AuditedDriver(Driver):
    """The planner with the AuditReady condition the observe step would add."""

    audit = _audit_condition("False")

    def observations(self, analysis):
        import dataclasses

        return dataclasses.replace(super().observations(analysis), extra_conditions=(self.audit,))


def _conditions(d: Driver) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in d.snapshot["status"]["conditions"]}


def test_a_first_version_does_not_serve_and_a_candidate_is_not_promoted_until_the_audit_is_ready():
    body = two_versions("1.0.0", rollbackWindowSeconds=0)
    body["spec"]["audit"] = copy.deepcopy(AUDIT)
    d = AuditedDriver(body)
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    promotion = d.snapshot["status"]["promotion"]
    assert promotion["phase"] == "Waiting" and promotion.get("stable") is None  # warm, not serving
    assert not [c for c in d.last.children if c["kind"] in ("Route", "Service")]
    assert _conditions(d)["Stalled"] == ("True", "AuditNotReady")
    assert _conditions(d)["Ready"] == ("False", "AuditNotReady")
    d.reconcile(3600)  # long past the progress deadline: a hold is not a failure
    assert d.snapshot["status"]["promotion"]["phase"] == "Waiting"
    assert d.last.requeue_after is not None and d.last.requeue_after <= 300  # the bucket is looked at again

    d.audit = _audit_condition("True", "BucketReady")
    d.reconcile(1)
    assert d.snapshot["status"]["promotion"]["stable"] == "1.0.0"

    d.audit = _audit_condition("Unknown", "AuditStorageUnreachable")  # S3 down: the next promotion waits, unstalled
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.set_ready("1.1.0")
    d.reconcile(1)
    assert d.snapshot["status"]["promotion"]["phase"] == "Waiting"
    assert _conditions(d)["Reconciling"] == ("True", "AuditNotReady")
    assert _conditions(d)["Stalled"][0] == "False"
    assert d.snapshot["status"]["promotion"]["stable"] == "1.0.0"  # the stable version keeps serving
    d.audit = _audit_condition("True", "BucketReady")
    d.reconcile(1)
    assert d.snapshot["status"]["promotion"]["stable"] == "1.1.0"
