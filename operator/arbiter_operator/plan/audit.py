"""spec.audit judged (pure): the AuditReady condition from what the audit bucket says, and whether it holds a
promotion back.

What the bucket must be, for records to be kept as asked: it exists; with a retention asked, versioning is on and
object lock is enabled (each record object is locked by the runtime that writes it, for `retention.days` in
`retention.mode`), and any default retention the bucket has is no weaker than asked (a GOVERNANCE default where
COMPLIANCE is asked, or fewer days, would promise less than the DecisionModel says for anything written to it without
a lock of its own). The first thing missing is the reason, with what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.conditions import AUDIT_READY, Condition
from ..api.models import AuditSpec
from ..promotion.model import PromotionHold

STDOUT_ONLY = "StdoutOnly"
BUCKET_READY = "BucketReady"
BUCKET_MISSING = "BucketMissing"
VERSIONING_OFF = "VersioningOff"
OBJECT_LOCK_OFF = "ObjectLockOff"
RETENTION_SHORTER = "RetentionShorterThanAsked"
AUDIT_CREDENTIALS_INVALID = "AuditCredentialsInvalid"
AUDIT_ACCESS_DENIED = "AuditAccessDenied"
AUDIT_UNREACHABLE = "AuditStorageUnreachable"
AUDIT_NOT_READY = "AuditNotReady"  # the promotion's reason while AuditReady holds it


@dataclass(frozen=True)
class BucketState:
    """What the operator read of the audit bucket (observe/audit.py)."""

    versioning: str  # Enabled | Suspended | "" (never enabled)
    lock_enabled: bool
    default_mode: str | None = None
    default_days: int | None = None


@dataclass(frozen=True)
class AuditVerdict:
    status: str  # True | False | Unknown
    reason: str
    message: str


def judge_bucket(audit: AuditSpec, state: BucketState | None) -> AuditVerdict:
    """The verdict for a bucket that was read (`state`), or that does not exist (None)."""
    assert audit.s3 is not None
    where = f"s3://{audit.s3.bucket}/{audit.s3.prefix}/"
    ret = audit.retention
    if state is None:
        return AuditVerdict("False", BUCKET_MISSING, f"bucket {audit.s3.bucket} does not exist: create it"
                            + (" with object lock enabled" if ret else "") + " or fix spec.audit.s3.bucket")
    if ret is None:
        return AuditVerdict("True", BUCKET_READY, f"records go to stdout and {where} (no retention asked: the "
                            "bucket's lifecycle decides how long they stay)")
    asked = f"{ret.mode} retention of {ret.days} days"
    if state.versioning != "Enabled":
        return AuditVerdict("False", VERSIONING_OFF, f"bucket {audit.s3.bucket} has versioning "
                            f"{(state.versioning or 'off').lower()}, and object lock needs it on for the {asked}: "
                            "create the bucket with object lock enabled (which turns versioning on)")
    if not state.lock_enabled:
        return AuditVerdict("False", OBJECT_LOCK_OFF, f"bucket {audit.s3.bucket} has no object lock, so records "
                            f"could be deleted before the {asked} ends: enable object lock on the bucket (or write "
                            "to one created with it)")
    weaker = state.default_mode == "GOVERNANCE" and ret.mode == "COMPLIANCE"
    shorter = state.default_days is not None and state.default_days < ret.days
    if state.default_mode and (weaker or shorter):
        return AuditVerdict("False", RETENTION_SHORTER, f"bucket {audit.s3.bucket}'s default retention is "
                            f"{state.default_mode} for {state.default_days} days, less than the {asked}: raise the "
                            "bucket's default retention or remove it (each record object has its own lock)")
    return AuditVerdict("True", BUCKET_READY, f"records go to stdout and {where}, each object locked in {ret.mode} "
                        f"mode for {ret.days} days (bucket object lock on)")


def stdout_only() -> AuditVerdict:
    return AuditVerdict("True", STDOUT_ONLY, "records go to each runtime's stdout only (no spec.audit.s3): they are "
                        "kept as long as the cluster's log collector keeps them")


def promotion_hold(audit: AuditSpec | None, condition: Condition | None) -> PromotionHold | None:
    """What holds a promotion back: a required audit whose AuditReady is not True. A False verdict needs a person
    (the bucket); an Unknown one (S3 unreachable, credentials not readable yet) clears by itself."""
    if audit is None or not audit.required or (condition is not None and condition.status == "True"):
        return None
    if condition is None:
        return PromotionHold(AUDIT_NOT_READY, "the audit bucket has not been checked yet", stalled=False)
    return PromotionHold(AUDIT_NOT_READY, f"{AUDIT_READY} is {condition.status} ({condition.reason}): "
                         f"{condition.message}", stalled=condition.status == "False")
