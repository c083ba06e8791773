"""Make the cluster match a plan: server-side apply of children that differ (ours only), deletions, one status patch,
events.

No write when nothing changed. A child is re-applied when (a) the live object lacks or differs in a field we set
(someone edited or deleted it), or (b) the desired manifest changed since our last apply (its hash, kept in an
annotation, differs) — (b) is what removes a field we no longer set, e.g. a Route's alternateBackends after a
promotion, because server-side apply drops fields its manager stops sending.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .api.conditions import EXPOSED
from .api.models import DecisionModel
from .api.names import ANN_APPLIED_HASH, ANN_DEPLOYMENT_MODE, API_VERSION, KIND, RAW_DEPLOYMENT, STANDARD
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
    annotations = {**(meta.get("annotations") or {}), ANN_APPLIED_HASH: checksum(_as_kserve_keeps_it(desired))[:16]}
    return {**desired, "metadata": {**meta, "annotations": annotations}}


def _as_kserve_keeps_it(desired: dict[str, Any]) -> dict[str, Any]:
    """The manifest as hashed: the plain-Deployment mode under one name. A first InferenceService is written with
    `RawDeployment`, which KServe 0.16+ rewrites to `Standard` (observe/kserve.py); the next pass renders `Standard`.
    Hashed apart, the two would re-apply a converged InferenceService only to change its hash annotation, and KServe
    copies annotations onto the predictor's pods: a new ReplicaSet, the first version NotReady a moment after Ready."""
    annotations = desired["metadata"].get("annotations") or {}
    if desired.get("kind") != "InferenceService" or annotations.get(ANN_DEPLOYMENT_MODE) != RAW_DEPLOYMENT:
        return desired
    meta = {**desired["metadata"], "annotations": {**annotations, ANN_DEPLOYMENT_MODE: STANDARD}}
    return {**desired, "metadata": meta}


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


@dataclass
class _Outcome:
    """What one pass's writes came to."""

    writes: int = 0
    conflicts: list[str] = field(default_factory=list)
    failed: list[WriteFailure] = field(default_factory=list)
    route_conflict: str | None = None  # the Route under our name is someone else's: not exposed by us


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
    out = _Outcome()
    if plan.children is not None:
        await _write_children(client, dm, plan.children, live_children, out)
        # A child not written (a Route still naming the old version, say) may still need what the plan deletes:
        # deletions wait for a pass whose writes all went through.
        if not out.failed:
            await _delete_unwanted(client, dm, plan.deletions, live_children, out)
    status = _reported_status(dm, plan.status, out, now)
    out.writes += await _patch_status(client, dm_raw, dm, status)
    out.writes += await _post_events(client, dm_raw, plan.events, out)
    if out.failed and all(f.transient for f in out.failed):
        # Not answered: status says so; the pass fails so the work queue retries it with back-off.
        first = out.failed[0]
        raise KubeError(first.status or 503, first.reason, first.line())
    return out.writes, out.conflicts + [f.line() for f in out.failed]


async def _write_children(client: KubeClient, dm: DecisionModel, children: list[dict[str, Any]],
                          live_children: dict[tuple[str, str], dict[str, Any]], out: _Outcome) -> None:
    """Each child created or updated where it is ours; a refused write is recorded and the rest still go."""
    ns = dm.metadata.namespace
    for desired in children:
        kind, name = desired["kind"], desired["metadata"]["name"]
        try:
            n, conflict = await _write_child(client, dm, desired, _live_child(live_children, desired))
        except NotLeader:
            raise
        except KubeError as exc:  # refused or not answered: shown on status; the other children still go
            out.failed.append(WriteFailure("apply", kind, ns, name, exc.status or None, exc.message or str(exc)))
            continue
        out.writes += n
        if conflict:
            out.conflicts.append(conflict)
            out.route_conflict = out.route_conflict or (conflict if kind == "Route" else None)


async def _delete_unwanted(client: KubeClient, dm: DecisionModel, deletions: list[tuple[str, str, str]],
                           live_children: dict[tuple[str, str], dict[str, Any]], out: _Outcome) -> None:
    """The children no longer wanted, deleted by uid (never an object that took the name since). One already being
    deleted is not asked again: what keeps it is a finalizer of another controller (OpenShift AI's registry
    controller holds a retired version's InferenceService until it has written its record), which no request of ours
    hurries, and a converged pass makes no request."""
    ns = dm.metadata.namespace
    for api_version, kind, name in deletions:
        live = live_children.get((kind, name)) or {}
        if (live.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            await client.adelete(api_version, kind, ns, name, uid=(live.get("metadata") or {}).get("uid"))
        except NotLeader:
            raise
        except KubeError as exc:
            out.failed.append(WriteFailure("delete", kind, ns, name, exc.status or None, exc.message or str(exc)))
            continue
        out.writes += 1


def _reported_status(dm: DecisionModel, status: dict[str, Any], out: _Outcome, now: datetime) -> dict[str, Any]:
    """The planned status, with what the writes met: children other owners hold, a Route not ours, refused writes."""
    gen = dm.metadata.generation
    if out.conflicts:
        status = with_child_conflicts(status, out.conflicts, gen, now)
    if out.route_conflict:
        status = with_condition(status, EXPOSED, "False", ROUTE_NOT_OWNED,
                                f"{out.route_conflict}: the operator does not write to it, so what it routes to is "
                                "not this DecisionModel's doing; rename or delete it", gen, now)
    if out.failed:
        status = with_write_failures(status, out.failed, gen, now)
    return status


async def _patch_status(client: KubeClient, dm_raw: dict[str, Any], dm: DecisionModel, status: dict[str, Any]) -> int:
    """One merge patch of what changed in the status (none when nothing did); the writes made."""
    patch = merge_patch(dm_raw.get("status") or {}, status)
    if patch is None:
        return 0
    try:
        await client.apatch_status(API_VERSION, KIND, dm.metadata.namespace, dm.metadata.name, {"status": patch})
    except KubeError as exc:
        if exc.status != 404:  # deleted meanwhile: nothing to report on
            raise
        return 0
    for outcome in new_promotion_outcomes(dm_raw.get("status"), status):
        PROMOTIONS.labels(outcome).inc()
    return 1


async def _post_events(client: KubeClient, dm_raw: dict[str, Any], planned: list[Event], out: _Outcome) -> int:
    """The plan's Events and those of what the writes met; the writes made."""
    involved = {"apiVersion": API_VERSION, "kind": KIND, "metadata": dm_raw["metadata"]}
    events = list(planned)
    conditions = (dm_raw.get("status") or {}).get("conditions") or []
    old_ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    if out.conflicts and old_ready.get("reason") != CHILD_CONFLICT:
        events.append(Event("Warning", CHILD_CONFLICT, conflict_message(out.conflicts)))
    if out.failed:  # one Event a pass; the client counts repeats into one series (kube/client.py)
        events.append(Event("Warning", CHILD_WRITE_REFUSED, write_failure_message(out.failed)))
    for ev in events:
        await client.aevent(involved, ev.type, ev.reason, ev.message)
    return len(events)


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
