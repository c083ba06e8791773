"""Make the cluster match a plan: server-side apply of children that differ, deletions, one status patch, events.

No write when nothing changed. A child is re-applied when (a) the live object lacks or differs in a field we set
(someone edited or deleted it), or (b) the desired manifest changed since our last apply (its hash, kept in an
annotation, differs) — (b) is what removes a field we no longer set, e.g. a Route's alternateBackends after a
promotion, because server-side apply drops fields its manager stops sending.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from .api.models import API_VERSION, KIND, DecisionModel
from .clients.kube import KubeClient, KubeError
from .plan.model import Plan
from .render.common import checksum

log = logging.getLogger("arbiter.apply")

ANN_APPLIED_HASH = "arbiter.dev/applied-hash"


def with_hash(desired: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(desired)
    out["metadata"].setdefault("annotations", {})[ANN_APPLIED_HASH] = checksum(desired)[:16]
    return out


def contains(live: Any, want: Any) -> bool:
    """Every field of `want` is in `live` with the same value (lists: same length, item by item)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(contains(a, b) for a, b in zip(live, want))
    return live == want


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


def _live_child(obs_children: dict[tuple[str, str], dict[str, Any]], desired: dict[str, Any]) -> dict | None:
    return obs_children.get((desired["kind"], desired["metadata"]["name"]))


def apply_plan(
    client: KubeClient,
    dm_raw: dict[str, Any],
    dm: DecisionModel,
    plan: Plan,
    live_children: dict[tuple[str, str], dict[str, Any]],
) -> int:
    """Returns the number of writes made."""
    writes = 0
    ns = dm.metadata.namespace
    if plan.children is not None:
        for desired in plan.children:
            stamped = with_hash(desired)
            if needs_apply(stamped, _live_child(live_children, desired)):
                client.apply(stamped)
                writes += 1
        for api_version, kind, name in plan.deletions:
            client.delete(api_version, kind, ns, name)
            writes += 1
    patch = merge_patch(dm_raw.get("status") or {}, plan.status)
    if patch is not None:
        try:
            client.patch_status(API_VERSION, KIND, ns, dm.metadata.name, {"status": patch})
            writes += 1
        except KubeError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise
    involved = {"apiVersion": API_VERSION, "kind": KIND, "metadata": dm_raw["metadata"]}
    for ev in plan.events:
        client.event(involved, ev.type, ev.reason, ev.message)
        writes += 1
    return writes
