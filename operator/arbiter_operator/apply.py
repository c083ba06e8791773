"""Make the cluster match a plan: server-side apply of children that differ (ours only), deletions, one status patch,
events.

No write when nothing changed. A child is re-applied when (a) the live object lacks or differs in a field we set
(someone edited or deleted it), or (b) the desired manifest changed since our last apply (its hash, kept in an
annotation, differs) — (b) is what removes a field we no longer set, e.g. a Route's alternateBackends after a
promotion, because server-side apply drops fields its manager stops sending.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from .api.conditions import EXPOSED
from .api.models import DecisionModel
from .api.names import ANN_APPLIED_HASH, API_VERSION, KIND
from .kube.client import KubeClient, KubeError, NotLeader
from .metrics import PROMOTIONS, new_promotion_outcomes
from .observe.children import controller_of, owned_by
from .plan.exposure import ROUTE_NOT_OWNED
from .plan.model import Event, Plan
from .plan.planner import CHILD_CONFLICT, conflict_message, with_child_conflicts
from .plan.writes import (
    CHILD_WRITE_REFUSED,
    WriteFailure,
    with_condition,
    with_write_failures,
    write_failure_message,
)
from .render.common import checksum

log = logging.getLogger("arbiter.apply")



def with_hash(desired: dict[str, Any]) -> dict[str, Any]:
    """`desired` with the hash of itself in an annotation. A new object, metadata and annotations; the rest is shared
    with `desired` (nothing downstream changes a manifest, and a deep copy of every child was a measurable share of a
    pass)."""
    meta = desired["metadata"]
    annotations = {**(meta.get("annotations") or {}), ANN_APPLIED_HASH: checksum(desired)[:16]}
    return {**desired, "metadata": {**meta, "annotations": annotations}}


def contains(live: Any, want: Any) -> bool:
    """Every field of `want` is in `live` with the same value (lists: same length, item by item)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(
            contains(a, b) for a, b in zip(live, want, strict=True))
    return bool(live == want)


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    if live is None:
        return True
    return not contains(live, desired)


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 patch turning `old` into `new` (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        patch: dict[str, Any] = {}
        for k in old.keys() - new.keys():
            patch[k] = None
        for k, v in new.items():
            if k not in old:
                patch[k] = v
            else:
                sub = merge_patch(old[k], v)
                if sub is not None:
                    patch[k] = sub
        return patch or None
    return None if old == new else new


def _live_child(obs_children: dict[tuple[str, str], dict[str, Any]], desired: dict[str, Any]) -> dict[str, Any] | None:
    return obs_children.get((desired["kind"], desired["metadata"]["name"]))


def describe_owner(obj: dict[str, Any], dm: DecisionModel) -> str:
    """Who holds an object we may not touch, in words (kinds, names and field managers only: nothing secret)."""
    ref = controller_of(obj)
    if ref is not None:
        same = ref.get("kind") == KIND and ref.get("name") == dm.metadata.name
        note = " (an earlier DecisionModel of this name; it goes once garbage collection removes it)" if same else ""
        return f"controlled by {ref.get('kind')} {ref.get('name')}{note}"
    managers = sorted({m.get("manager") for m in (obj["metadata"].get("managedFields") or []) if m.get("manager")})
    return "not controlled by any owner" + (f" (written by {', '.join(managers)})" if managers else "")


async def apply_plan(
    client: KubeClient,
    dm_raw: dict[str, Any],
    dm: DecisionModel,
    plan: Plan,
    live_children: dict[tuple[str, str], dict[str, Any]],
    now: datetime,
) -> tuple[int, list[str]]:
    """Returns the number of writes made and the children not written: another owner holds them, or the apiserver
    refused the write (plan/writes.py; both are looked at again within a minute). Awaited on the operator's event
    loop, where the requests are made: no thread per request.

    Ownership is decided here, before any write, never by server-side apply: a child is updated only when its
    controller ownerReference is this DecisionModel (uid); a child not among ours is created with a create-only apply
    (the apiserver refuses it when the name is taken, without touching that object: no read is needed first); an
    object found under the name is then read, and left untouched and reported (ChildConflict) with its owner unless
    it is ours.
    """
    writes = 0
    conflicts: list[str] = []
    failed: list[WriteFailure] = []
    route_conflict: str | None = None  # the Route under our name is someone else's: not exposed by us
    ns = dm.metadata.namespace
    if plan.children is not None:
        for desired in plan.children:
            kind, name = desired["kind"], desired["metadata"]["name"]
            try:
                n, conflict = await _write_child(client, dm, desired, _live_child(live_children, desired))
            except NotLeader:
                raise
            except KubeError as exc:  # refused or not answered: shown on status; the other children still go
                failed.append(WriteFailure("apply", kind, ns, name, exc.status or None, exc.message or str(exc)))
                continue
            writes += n
            if conflict:
                conflicts.append(conflict)
                route_conflict = route_conflict or (conflict if kind == "Route" else None)
        # A child not written (a Route still naming the old version, say) may still need what the plan deletes:
        # deletions wait for a pass whose writes all went through.
        for api_version, kind, name in plan.deletions if not failed else ():
            live = live_children.get((kind, name)) or {}
            try:
                await client.adelete(api_version, kind, ns, name, uid=(live.get("metadata") or {}).get("uid"))
            except NotLeader:
                raise
            except KubeError as exc:
                failed.append(WriteFailure("delete", kind, ns, name, exc.status or None, exc.message or str(exc)))
                continue
            writes += 1
    status = plan.status
    if conflicts:
        status = with_child_conflicts(status, conflicts, dm.metadata.generation, now)
    if route_conflict:
        status = with_condition(status, EXPOSED, "False", ROUTE_NOT_OWNED,
                                f"{route_conflict}: the operator does not write to it, so what it routes to is not "
                                "this DecisionModel's doing; rename or delete it", dm.metadata.generation, now)
    if failed:
        status = with_write_failures(status, failed, dm.metadata.generation, now)
    patch = merge_patch(dm_raw.get("status") or {}, status)
    if patch is not None:
        try:
            await client.apatch_status(API_VERSION, KIND, ns, dm.metadata.name, {"status": patch})
            writes += 1
            for outcome in new_promotion_outcomes(dm_raw.get("status"), status):
                PROMOTIONS.labels(outcome).inc()
        except KubeError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise
    involved = {"apiVersion": API_VERSION, "kind": KIND, "metadata": dm_raw["metadata"]}
    events = list(plan.events)
    conditions = (dm_raw.get("status") or {}).get("conditions") or []
    old_ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    if conflicts and old_ready.get("reason") != CHILD_CONFLICT:
        events.append(Event("Warning", CHILD_CONFLICT, conflict_message(conflicts)))
    if failed:  # one Event a pass; the client counts repeats into one series (kube/client.py)
        events.append(Event("Warning", CHILD_WRITE_REFUSED, write_failure_message(failed)))
    for ev in events:
        await client.aevent(involved, ev.type, ev.reason, ev.message)
        writes += 1
    if failed and all(f.transient for f in failed):
        # Not answered: status says so; the pass fails so the work queue retries it with back-off.
        first = failed[0]
        raise KubeError(first.status or 503, first.reason, first.line())
    return writes, conflicts + [f.line() for f in failed]


async def _write_child(
    client: KubeClient, dm: DecisionModel, desired: dict[str, Any], live: dict[str, Any] | None
) -> tuple[int, str | None]:
    """Create or update one child; (writes made, the conflict when another owner holds the name)."""
    ns = dm.metadata.namespace
    stamped = with_hash(desired)
    kind, name = desired["kind"], desired["metadata"]["name"]
    if live is None:  # not among the children we found as ours: create it, if (and only if) the name is free
        try:
            await client.acreate(stamped)
            return 1, None
        except KubeError as exc:
            if exc.status != 409:
                raise
            # Taken: by another owner, or by our own child the cache does not hold (e.g. its label was
            # removed). Only now is it read, to tell which.
            live = await client.aget(desired["apiVersion"], kind, ns, name)
            if live is None:  # deleted in between: the next reconcile creates it
                raise
    if not owned_by(live, dm.metadata.uid):
        return 0, f"{kind} {ns}/{name} already exists and is {describe_owner(live, dm)}"
    if needs_apply(stamped, live):
        # force only on our own object (taking back fields someone edited); a create never forces.
        await client.aapply(stamped, force=True)
        return 1, None
    return 0, None
