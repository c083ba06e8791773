"""A child write that failed, shown where a user looks (pure): `Reconciling=True` on the DecisionModel, with a reason
and a message naming each object and what the apiserver said, and one Warning Event for the pass.

Refused (a 4xx, or an answer that denied the request, even as a 500: plan/signals.py): reason `ChildWriteRefused`;
the operator looks again within a minute (a webhook or a policy may change its mind), nothing else is held back.
Not answered (5xx, 429, timeouts): the transient reason (`WebhookUnavailable`, `ApiserverUnavailable`); the pass is
retried with back-off. `Ready` is left as the plan computed it: it is read from the objects as they are, so a write
that did not happen cannot have made serving less safe than it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..api import conditions as c
from ..api.conditions import Condition, make_condition, set_condition
from .signals import classify_status

CHILD_WRITE_REFUSED = "ChildWriteRefused"
# The apiserver's message is shown as it came, cut: what `oc apply` of the same object would print to whoever may read
# the DecisionModel's namespace. The operator writes no Secret, so no credential can be echoed back.
MESSAGE_LIMIT = 300


@dataclass(frozen=True)
class WriteFailure:
    verb: str  # create | apply | delete
    kind: str
    namespace: str
    name: str
    status: int | None
    message: str

    @property
    def transient(self) -> bool:
        return classify_status(self.status, self.message, CHILD_WRITE_REFUSED).transient

    @property
    def reason(self) -> str:
        return classify_status(self.status, self.message, CHILD_WRITE_REFUSED).reason

    def line(self) -> str:
        said = self.message if len(self.message) <= MESSAGE_LIMIT else self.message[:MESSAGE_LIMIT] + "..."
        code = f" ({self.status})" if self.status else ""
        return f"{self.verb} of {self.kind} {self.namespace}/{self.name} failed{code}: {said}"


def write_failure_message(failures: list[WriteFailure]) -> str:
    shown = [f.line() for f in failures[:3]] + ([f"{len(failures) - 3} more"] if len(failures) > 3 else [])
    refused = any(not f.transient for f in failures)
    then = ("the operator tries again within a minute; fix what refuses it (the message names it)" if refused
            else "the apiserver did not answer; the operator retries with back-off")
    return "; ".join(shown) + f". Everything else was reconciled; {then}"


def failure_reason(failures: list[WriteFailure]) -> str:
    """A refusal outweighs an outage: it needs a person."""
    refused = next((f for f in failures if not f.transient), None)
    return refused.reason if refused is not None else failures[0].reason


def with_condition(
    status: dict[str, Any], type_: str, value: c.ConditionStatus, reason: str, message: str, generation: int,
    now: datetime,
) -> dict[str, Any]:
    """The planned status with one condition set (what apply learns only by writing, e.g. a Route another owner
    holds)."""
    conditions = [Condition.model_validate(x) for x in status.get("conditions") or []]
    conditions = set_condition(conditions, make_condition(type_, value, reason, message, generation, now))
    return {**status, "conditions": [x.model_dump(mode="json", exclude_none=True) for x in conditions]}


def with_write_failures(
    status: dict[str, Any], failures: list[WriteFailure], generation: int, now: datetime
) -> dict[str, Any]:
    """The planned status with the failed writes on Reconciling (True: the operator is still at it)."""
    return with_condition(status, c.RECONCILING, "True", failure_reason(failures), write_failure_message(failures),
                          generation, now)
