"""The audit bucket of spec.audit, read with the operator's own S3 client (clients/s3.py): does it exist, is versioning
on, is object lock enabled and with which default retention. Judged by plan/audit.py into the AuditReady condition.

Never raises for storage trouble: S3 unreachable, a Secret not found or not usable, access denied are an Unknown
verdict, checked again with backoff (plan/recheck.py). Settled verdicts are kept (`AuditVerdicts`): True for an hour (a
bucket replaced under a serving model is seen within it), False for 5 minutes (a fixed bucket is seen soon; a new
spec.audit is checked at once).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..api.conditions import AUDIT_READY, make_condition
from ..api.models import AuditSpec, DecisionModel
from ..clients.s3 import (
    CredentialsInvalid,
    S3Credentials,
    StorageRejected,
    StorageUnreachable,
    credentials_from_secret,
    decode_secret_data,
)
from ..kube.client import KubeError
from ..plan.audit import (
    AUDIT_ACCESS_DENIED,
    AUDIT_CREDENTIALS_INVALID,
    AUDIT_UNREACHABLE,
    AuditVerdict,
    BucketState,
    judge_bucket,
    stdout_only,
)
from ..plan.model import Observations
from .storage import SecretReads, StoragePool

AUDIT_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # what the runtimes read too (render/inferenceservice.py)
CHECKED_AGAIN = "; checked again shortly"


class AuditVerdicts:
    """Settled verdicts per (DecisionModel uid, spec.audit): True for `valid_ttl`, False for `ttl` seconds."""

    def __init__(self, ttl: float = 300.0, valid_ttl: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.valid_ttl, self._clock = ttl, valid_ttl, clock
        self._held: dict[str, tuple[str, float, AuditVerdict]] = {}  # uid -> (digest, when, verdict)

    def get(self, uid: str, digest: str) -> AuditVerdict | None:
        hit = self._held.get(uid)
        if not uid or hit is None or hit[0] != digest:
            return None
        keep = self.valid_ttl if hit[2].status == "True" else self.ttl
        return hit[2] if self._clock() - hit[1] <= keep else None

    def put(self, uid: str, digest: str, verdict: AuditVerdict) -> None:
        if not uid or verdict.status == "Unknown":
            self._held.pop(uid, None)
            return
        self._held[uid] = (digest, self._clock(), verdict)


async def audit_credentials(kube: Any, dm: DecisionModel, audit: AuditSpec,
                            secrets: SecretReads) -> S3Credentials | AuditVerdict:
    assert audit.s3 is not None
    s3, ns = audit.s3, dm.metadata.namespace
    try:
        secret = await secrets.get(kube, ns, s3.secretName)
    except KubeError as exc:
        return AuditVerdict("Unknown", AUDIT_CREDENTIALS_INVALID, f"cannot read Secret {s3.secretName} ({exc.status} "
                            f"{exc.reason}){CHECKED_AGAIN}")
    if secret is None:
        return AuditVerdict("Unknown", AUDIT_CREDENTIALS_INVALID, f"Secret {s3.secretName} (spec.audit.s3.secretName) "
                            f"not found in namespace {ns}: create it with {' and '.join(AUDIT_KEYS)}{CHECKED_AGAIN}")
    try:
        text = decode_secret_data(secret.get("data"))
        missing = [k for k in AUDIT_KEYS if not text.get(k)]
        if missing:
            raise CredentialsInvalid(f"Secret {s3.secretName} has no {' or '.join(missing)} (the runtimes write the "
                                     "audit with them)")
        return credentials_from_secret({k: text[k] for k in AUDIT_KEYS}, secret_name=s3.secretName, bucket=s3.bucket,
                                       endpoint=s3.endpoint, region=s3.region)
    except CredentialsInvalid as exc:
        return AuditVerdict("Unknown", AUDIT_CREDENTIALS_INVALID, f"{exc}{CHECKED_AGAIN}")


async def check_audit(kube: Any, dm: DecisionModel, secrets: SecretReads, pool: StoragePool) -> AuditVerdict:
    audit = dm.spec.audit
    assert audit is not None
    if audit.s3 is None:
        return stdout_only()
    creds = await audit_credentials(kube, dm, audit, secrets)
    if isinstance(creds, AuditVerdict):
        return creds
    bucket = audit.s3.bucket
    try:
        async with pool.use(creds) as storage:
            versioning = await storage.bucket_versioning(bucket)
            lock = await storage.object_lock(bucket) if audit.retention is not None else None
    except StorageUnreachable as exc:
        return AuditVerdict("Unknown", AUDIT_UNREACHABLE, f"{exc}; a version waits for it before it serves")
    except StorageRejected as exc:
        if exc.code == "NoSuchBucket":
            return judge_bucket(audit, None)
        return AuditVerdict("Unknown", AUDIT_ACCESS_DENIED, f"{exc}: the credentials of {audit.s3.secretName} need "
                            f"s3:GetBucketVersioning and s3:GetBucketObjectLockConfiguration on {bucket} (and "
                            f"s3:PutObject, s3:PutObjectRetention for the runtimes){CHECKED_AGAIN}")
    state = BucketState(versioning, lock.enabled if lock else False, lock.mode if lock else None,
                        lock.days if lock else None)
    return judge_bucket(audit, state)


async def observe_audit(kube: Any, dm: DecisionModel, obs: Observations, now: datetime, verdicts: AuditVerdicts,
                        secrets: SecretReads, pool: StoragePool | None) -> Observations:
    """The AuditReady condition, stamped with the reconcile's `now`; nothing without spec.audit."""
    audit = dm.spec.audit
    if audit is None:
        return obs
    digest = hashlib.sha256(audit.model_dump_json().encode()).hexdigest()
    verdict = verdicts.get(dm.metadata.uid, digest)
    if verdict is None:
        own = StoragePool(idle=0.0) if pool is None else pool
        try:
            verdict = await check_audit(kube, dm, secrets, own)
        finally:
            if pool is None:
                await own.aclose()
        verdicts.put(dm.metadata.uid, digest, verdict)
    cond = make_condition(AUDIT_READY, verdict.status, verdict.reason,  # type: ignore[arg-type]
                          verdict.message, dm.metadata.generation, now)
    return replace(obs, extra_conditions=(*obs.extra_conditions, cond))
