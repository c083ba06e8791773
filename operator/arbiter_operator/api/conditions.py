"""One vocabulary of status conditions for every part of Arbiter (see docs/operations.md).

Conditions are `metav1.Condition`-shaped. `set_condition` is pure: it returns a new list and keeps
`lastTransitionTime` unless the condition's `status` flips, which is what kstatus and `kubectl wait` expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .times import format_time

# Condition types.
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
ARTIFACTS_VALID = "ArtifactsValid"
TOKEN_COST = "TokenCost"  # a warning: never holds a version back
REGISTERED = "Registered"
AUDIT_READY = "AuditReady"  # spec.audit: the bucket holds the records as asked
SERVING = "Serving"
EXPOSED = "Exposed"
PROMOTED = "Promoted"

CONDITION_TYPES = (READY, RECONCILING, STALLED, ARTIFACTS_VALID, TOKEN_COST, REGISTERED, AUDIT_READY, SERVING, EXPOSED,
                   PROMOTED)

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(BaseModel):
    """metav1.Condition."""

    model_config = ConfigDict(populate_by_name=True)

    type: str = Field(description="Condition type, CamelCase (Ready, Serving, Promoted, ...).")
    status: ConditionStatus
    observedGeneration: int = Field(0, ge=0, description="metadata.generation this condition was computed from.")
    lastTransitionTime: str = Field(description="RFC 3339 time of the last change of status.")
    reason: str = Field(description="CamelCase reason, stable for automation.")
    message: str = Field("", description="What happened and what to do about it.")


def make_condition(
    type_: str, status: ConditionStatus, reason: str, message: str, generation: int, now: datetime
) -> Condition:
    """`now` is the reconcile's one clock reading (reconcile.py): no condition reads the wall clock itself."""
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observedGeneration=generation,
        lastTransitionTime=format_time(now),
    )


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Return `conditions` with `new` in place of the condition of the same type.

    lastTransitionTime is carried over from the old condition when the status did not change.
    """
    out: list[Condition] = []
    replaced = False
    for old in conditions:
        if old.type == new.type:
            if old.status == new.status:
                new = new.model_copy(update={"lastTransitionTime": old.lastTransitionTime})
            out.append(new)
            replaced = True
        else:
            out.append(old)
    if not replaced:
        out.append(new)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event the operator posts on a transition (the planner and the promotion machine both emit them)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
