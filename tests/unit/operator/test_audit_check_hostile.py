"""The audit bucket check (observe/audit.py) against an S3 endpoint at its worst, with the operator's own S3 client:
every answer is a verdict (True, False naming what is missing, Unknown naming what to fix or that it is checked
again), never an exception, and never a credential in a message."""

from __future__ import annotations

import asyncio
import base64
import http.server

import pytest
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.observe.audit import AuditVerdicts, check_audit
from arbiter_operator.observe.storage import SecretReads, StoragePool
from support.http_stub import answer, serving
from support.plannerdrive import two_versions

SECRET_KEY = "wJalrXUtnFEMI-canary-secret"
NS_XML = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
LOCKED = (f"<ObjectLockConfiguration {NS_XML}><ObjectLockEnabled>Enabled</ObjectLockEnabled>"
          "</ObjectLockConfiguration>").encode()
VERSIONED = f"<VersioningConfiguration {NS_XML}><Status>Enabled</Status></VersioningConfiguration>".encode()


def _error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>{SECRET_KEY}</Message></Error>".encode()


# what S3 answers to ?versioning and ?object-lock -> (status, reason)
CASES = {
    "ready": ((200, VERSIONED), (200, LOCKED), "True", "BucketReady"),
    "no_lock": ((200, VERSIONED), (404, _error("ObjectLockConfigurationNotFoundError")), "False", "ObjectLockOff"),
    "no_bucket": ((404, _error("NoSuchBucket")), None, "False", "BucketMissing"),
    "denied": ((403, _error("AccessDenied")), None, "Unknown", "AuditAccessDenied"),
    "failing": ((500, _error("InternalError")), None, "Unknown", "AuditStorageUnreachable"),
    "garbage": ((200, b"<html>proxy login</html>"), None, "Unknown", "AuditStorageUnreachable"),
    "entities": ((200, b'<!DOCTYPE x [<!ENTITY a "aaaa">]><VersioningConfiguration>&a;</VersioningConfiguration>'),
                 None, "Unknown", "AuditStorageUnreachable"),
    "huge": ((200, b"<VersioningConfiguration>" + b" " * (64 * 1024) + b"</VersioningConfiguration>"), None,
             "Unknown", "AuditStorageUnreachable"),
    "lock_lies": ((200, VERSIONED), (200, b"<ObjectLockConfiguration><Rule><DefaultRetention><Days>7x</Days>"
                                          b"</DefaultRetention></Rule></ObjectLockConfiguration>"),
                  "Unknown", "AuditStorageUnreachable"),
}


class Kube:
    def __init__(self, data: dict[str, str] | None):
        self.data = data

    async def aget(self, api_version, kind, namespace, name):
        if self.data is None:
            return None
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.data.items()}}


def _dm(endpoint: str) -> DecisionModel:
    body = two_versions()
    body["spec"]["audit"] = {"s3": {"bucket": "audit", "secretName": "audit-s3", "endpoint": endpoint},
                             "retention": {"mode": "COMPLIANCE", "days": 30}}
    return DecisionModel.model_validate(body)


def _check(dm: DecisionModel, kube: Kube):
    async def run():
        pool = StoragePool(idle=0.0)
        try:
            return await check_audit(kube, dm, SecretReads(ttl=0.0), pool)
        finally:
            await pool.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_answer_is_a_verdict_naming_what_to_do(case):
    versioning, lock, status, reason = CASES[case]

    class S3(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if "versioning" in self.path:
                answer(self, *versioning, content_type="application/xml")
            elif "object-lock" in self.path and lock is not None:
                answer(self, *lock, content_type="application/xml")
            else:
                answer(self, 400, _error("UnexpectedRequest"))

        def log_message(self, *args):
            pass

    with serving(S3) as url:
        verdict = _check(_dm(url), Kube({"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": SECRET_KEY}))
    assert (verdict.status, verdict.reason) == (status, reason), verdict.message
    assert SECRET_KEY not in verdict.message and verdict.message


def test_missing_or_incomplete_credentials_are_named():
    dm = _dm("http://127.0.0.1:9")
    missing = _check(dm, Kube(None))
    assert (missing.status, missing.reason) == ("Unknown", "AuditCredentialsInvalid") and "audit-s3" in missing.message
    partial = _check(dm, Kube({"AWS_ACCESS_KEY_ID": "AKIA"}))
    assert "AWS_SECRET_ACCESS_KEY" in partial.message


def test_settled_verdicts_are_kept_and_unknown_ones_never():
    clock = [0.0]
    verdicts = AuditVerdicts(ttl=300, valid_ttl=3600, clock=lambda: clock[0])
    from arbiter_operator.plan.audit import AuditVerdict

    verdicts.put("uid", "d1", AuditVerdict("False", "ObjectLockOff", "x"))
    assert verdicts.get("uid", "d1") is not None and verdicts.get("uid", "d2") is None  # a new spec.audit: at once
    clock[0] = 301
    assert verdicts.get("uid", "d1") is None  # a fixed bucket is seen within 5 minutes
    verdicts.put("uid", "d1", AuditVerdict("True", "BucketReady", "x"))
    clock[0] = 301 + 3599
    assert verdicts.get("uid", "d1") is not None
    verdicts.put("uid", "d1", AuditVerdict("Unknown", "AuditStorageUnreachable", "x"))
    assert verdicts.get("uid", "d1") is None
