"""A DecisionModel the operator cannot take in (it does not decode, or its API refuses it) gets a status that says so,
and nothing else: Stalled=True, Reconciling=False and Ready=False with reason InvalidSpec, at its generation. Its
children are left as they are (what serves keeps serving, as for any InvalidSpec). Where even that status cannot be
written, a Warning Event says why, and arbiter_operator_objects_refused_total counts it: one object never stops the
passes of the others.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from . import metrics
from .api import conditions as c
from .api.conditions import Condition, make_condition, set_condition
from .api.kubejson import REFUSED
from .api.models import MAX_SCHEMA_DEPTH
from .api.names import API_VERSION, KIND
from .apply import merge_patch
from .kube.client import KubeClient, NotLeader

log = logging.getLogger("arbiter.reconcile")

INVALID_SPEC = "InvalidSpec"
STATUS_REFUSED = "StatusRefused"


def undecodable_message(raw: dict[str, Any]) -> str:
    return (f"the operator cannot read this DecisionModel: {raw[REFUSED]}. JSON nested deeper than 1,024 levels is "
            f"never decoded, and inputSchema and outputSchema may nest at most {MAX_SCHEMA_DEPTH} levels. Nothing "
            "was changed: fix the spec to continue.")


def invalid_message(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', '')}"[:400])
    return "the spec does not match this operator's API: " + "; ".join(problems) + \
        ". Nothing was changed: fix the spec to continue."


def _conditions(raw: dict[str, Any]) -> list[Condition]:
    held = ((raw.get("status") if isinstance(raw.get("status"), dict) else None) or {}).get("conditions")
    out = []
    for item in held if isinstance(held, list) else []:
        try:
            out.append(Condition.model_validate(item))
        except ValidationError:
            continue  # a condition this operator cannot read is written anew
    return out


def refusal_status(raw: dict[str, Any], message: str, now: datetime) -> dict[str, Any]:
    """The status of a refused DecisionModel: its conditions with Stalled, Reconciling and Ready saying why."""
    generation = (raw.get("metadata") or {}).get("generation")
    gen = generation if isinstance(generation, int) and generation >= 0 else 0
    conds = _conditions(raw)
    for type_, status in ((c.STALLED, "True"), (c.RECONCILING, "False"), (c.READY, "False")):
        conds = set_condition(conds, make_condition(type_, status, INVALID_SPEC, message[:4000], gen, now))  # type: ignore[arg-type]
    return {"observedGeneration": gen, "conditions": [x.model_dump() for x in conds]}


async def refuse(client: KubeClient, raw: dict[str, Any], message: str, now: datetime) -> None:
    """Write the refusal status (only what changed), post a Warning Event on the transition into it; an Event and the
    metric where the status cannot be written."""
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    held = raw.get("status")
    old: dict[str, Any] = held if isinstance(held, dict) else {}
    status = refusal_status(raw, message, now)
    involved = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta}
    was_refused = any(x.type == c.READY and x.reason == INVALID_SPEC and x.message == message[:4000]
                      for x in _conditions(raw))
    patch = merge_patch(old, {**old, **status})  # the rest of the status (the promotion's record) stays
    if patch is None:
        return
    log.warning("%s/%s refused: %s", namespace, name, message)
    try:
        await client.apatch_status(API_VERSION, KIND, namespace, name, {"status": patch})
    except NotLeader:  # this replica no longer leads: the leader writes it; nothing was refused
        raise
    except Exception as exc:  # the apiserver refused even the status (or did not answer): say so another way
        metrics.OBJECTS_REFUSED.labels(KIND, STATUS_REFUSED).inc()
        log.error("%s/%s: its refusal could not be written to its status (%s)", namespace, name, exc)
        await _event(client, involved, STATUS_REFUSED, f"{message} (the status could not be written: {exc})"[:1000])
        return
    metrics.OBJECTS_REFUSED.labels(KIND, INVALID_SPEC).inc()  # counted once it shows on the status
    if not was_refused:
        await _event(client, involved, INVALID_SPEC, message[:1000])


async def _event(client: KubeClient, involved: dict[str, Any], reason: str, message: str) -> None:
    try:
        await client.aevent(involved, "Warning", reason, message)
    except NotLeader:
        raise
    except Exception as exc:  # an Event is best effort: the log line and the metric stay
        log.error("%s/%s: the %s Event could not be posted (%s)", involved["metadata"].get("namespace"),
                  involved["metadata"].get("name"), reason, exc)
