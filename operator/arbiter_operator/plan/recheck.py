"""When to look again at something outside the cluster that could not be asked (pure, no I/O).

`Registered=Unknown` (registry unreachable) and `ArtifactsValid=Unknown` (S3 unreachable, storage credentials not
usable yet) are answered "later": nothing in the cluster changes when the registry comes back or a Secret is fixed
(the operator does not watch Secrets: that would stream every Secret of the namespace to it), so the reconcile must
come back by itself. The delay grows with how long the condition has been Unknown (its lastTransitionTime): 5 s,
then about as long again as it has lasted (so the checks double), at most 60 s.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from ..api.backoff import OUTSIDE_RECHECK
from ..api.conditions import ARTIFACTS_VALID, AUDIT_READY, REGISTERED, Condition
from ..api.times import parse_time

OUTSIDE = (REGISTERED, ARTIFACTS_VALID, AUDIT_READY)
# An audit bucket found wanting (AuditReady=False) is fixed outside the cluster too: looked at again after this long
# (observe/audit.py keeps a False verdict as long), so a fixed bucket lets a held promotion go on by itself.
AUDIT_FALSE_RECHECK = 300.0


def recheck_after(conditions: Iterable[Condition], now: datetime) -> float | None:
    """Seconds until the next reconcile should ask the registry / S3 again; None when nothing waits on them."""
    delays = []
    for c in conditions:
        if c.type == AUDIT_READY and c.status == "False":
            delays.append(AUDIT_FALSE_RECHECK)
        if c.type in OUTSIDE and c.status == "Unknown":
            since = parse_time(c.lastTransitionTime)
            if since is not None and now.tzinfo is None:
                now = now.replace(tzinfo=UTC)
            elapsed = (now - since).total_seconds() if since is not None else 0.0
            delays.append(OUTSIDE_RECHECK.delay(elapsed))
    return min(delays) if delays else None


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two requeue delays (None: no requeue asked)."""
    if a is None:
        return b
    return a if b is None else min(a, b)
