"""spec.audit on the real stack: the operator checks the audit bucket on the real S3 server (MinIO) with its own S3
client before a version serves, renders the sink into the version's runtime, and the runtime (a real decision
server started with the environment the operator rendered) writes every decision to that bucket under the retention
asked (support/governance_kit.py says what plays the pods)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from kubernetes import client
from support.governance_kit import V1
from support.identities import service_account_token

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_compliance_retention_waits_for_object_lock_then_every_decision_lands_locked(governed, s3_server):
    g = governed
    s3 = s3_server.client()
    plain, locked = f"audit-plain-{g.ns}", f"audit-locked-{g.ns}"
    s3.create_bucket(Bucket=plain)
    s3.put_bucket_versioning(Bucket=plain, VersioningConfiguration={"Status": "Enabled"})  # versioning, no lock
    s3.create_bucket(Bucket=locked, ObjectLockEnabledForBucket=True)
    client.CoreV1Api(g.api).create_namespaced_secret(g.ns, {"metadata": {"name": "audit-s3"}, "stringData": {
        "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
    audit = {"s3": {"bucket": plain, "prefix": "decisions", "secretName": "audit-s3",
                    "endpoint": s3_server.endpoint_url, "region": s3_server.region},
             "retention": {"mode": "COMPLIANCE", "days": 1}}
    g.create(spec={"audit": audit, "access": {"serviceAccounts": [{"name": "pricing-app"}]}},
             rollbackWindowSeconds=0)
    g.set_fate(V1, "ready")

    # Warm and ready, yet not serving: the bucket cannot hold the records for the retention asked.
    g.wait(lambda: g.condition("AuditReady").get("reason") == "ObjectLockOff"
           and g.condition("Stalled").get("reason") == "AuditNotReady"
           and any(v.get("ready") for v in g.dm()["status"].get("versions") or []), "held on ObjectLockOff")
    assert g.condition("AuditReady")["status"] == "False" and plain in g.condition("AuditReady")["message"]
    assert g.promotion().get("stable") is None and g.stable_version() is None  # no Service, no Route: not served
    assert g.condition("Ready")["status"] == "False"

    # The bucket with object lock: checked, ready, and the version serves.
    g.patch_spec({"audit": {"s3": {"bucket": locked}}})
    g.wait(lambda: g.condition("AuditReady").get("status") == "True" and g.promotion().get("stable") == V1
           and g.rendered_env(V1).get("ARBITER_AUDIT_S3_BUCKET") == locked, "1.0.0 serving, audit ready")

    # The version's runtime, with the audit settings the operator rendered on its InferenceService.
    rendered = {k: v for k, v in g.rendered_env(V1).items() if k.startswith(("ARBITER_AUDIT_", "AWS_"))}
    assert rendered["ARBITER_AUDIT_S3_LOCK_MODE"] == "COMPLIANCE" and rendered["ARBITER_AUDIT_S3_RETENTION_DAYS"] == "1"
    g.start_runtime(V1, env={**rendered, "ARBITER_AUDIT_S3_INTERVAL_S": "1"})
    caller = service_account_token(g.api, g.ns, "pricing-app")
    started = dt.datetime.now(dt.UTC)
    ids = set()
    for _ in range(12):
        status, body = g.via_stable(caller)
        assert status == 200, body
        ids.add(body["traceId"])
    g.procs[V1].stop()  # SIGTERM: the runtime uploads what it holds before it exits

    records, keys = [], []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=locked):
        for obj in page.get("Contents", []):
            keys.append(obj["Key"])
            records += [json.loads(line) for line in
                        s3.get_object(Bucket=locked, Key=obj["Key"])["Body"].read().decode().splitlines()]
    decided = [r for r in records if r.get("kind") == "arbiter.decision"]
    assert {r["traceId"] for r in decided} == ids and len(decided) == len(ids), (keys, records[:2])
    assert all(k.startswith(f"decisions/{g.name}/{V1}/") for k in keys), keys  # none written without retention
    assert {r["version"] for r in decided} == {V1}
    for key in keys:
        retention = s3.get_object_retention(Bucket=locked, Key=key)["Retention"]
        assert retention["Mode"] == "COMPLIANCE"
        assert retention["RetainUntilDate"] >= started + dt.timedelta(days=1) - dt.timedelta(minutes=1)
    assert not s3.list_objects_v2(Bucket=plain).get("Contents")
