"""The Model Registry's delete path: deleting a DecisionModel archives its versions in the registry.

The registry lives outside the cluster, so owner references cannot clean it up: the finalizer
`arbiter.dev/registry-archive` holds the DecisionModel until `registration.archive_all` has set every version it
registered to ARCHIVED (nothing is deleted: the audit trail stays). The finalizer is added and removed by the
operator's own reconcile with small JSON patches on `metadata.finalizers` (each guarded by a `test` op), and only on
DecisionModels with `spec.registry`; a DecisionModel without one sees no write from this module at all.

No kopf change handler is used: kopf would keep its diff base (`last-handled-configuration`, a copy of the whole
spec) in an annotation and write it together with the finalizer removal, which the apiserver refuses once a large
spec pushes the annotations past 262,144 bytes, and the object would never go.

Registry down, or refusing (a revoked token): retried with a growing delay (5 s doubling, at most 5 min), the
`Registered` condition says why, a Warning event now and then. The escape hatch for SREs (remove the finalizer
by hand, which leaves the entries LIVE) is in docs/operations.md ("Deleting a DecisionModel with a registry").
The object is let go without archiving in two cases, because nothing would ever unblock it: status records no
registry entry and the registry cannot be asked (it never registered anything: a typo'd URL, a ModelRegistry that
never existed), or the namespace itself is being deleted and the registry's references (token Secret, CA ConfigMap,
ModelRegistry) are already gone; in the second case the entries stay LIVE and the log says so.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from .api.backoff import REGISTRY_ARCHIVE_BACKOFF
from .api.conditions import REGISTERED, get_condition, set_condition
from .api.models import DecisionModel
from .api.names import API_VERSION, CORE_API, GROUP, KIND
from .kube.client import KubeError
from .observe.registry import resolve_registry
from .sync.registry import archive_all, forget, mark_deleting, registry_lock

log = logging.getLogger("arbiter.registry")

FINALIZER = f"{GROUP}/registry-archive"
EVENT_EVERY = 6  # retries between repeated Warning events (about every 30 min once the delay is at its cap)


def retry_delay(retry: int) -> float:
    """Seconds before the next attempt after `retry` failed ones: 5, 10, 20, ... capped at 5 min."""
    return REGISTRY_ARCHIVE_BACKOFF.delay(retry)


async def _report(kube: Any, raw: dict[str, Any], dm: DecisionModel, cond: Any, retry: int, delay: float) -> None:
    """Registered condition on the object being deleted (its reconcile no longer runs), and a Warning event."""
    old = get_condition(dm.status.conditions, REGISTERED)
    if old is None or (old.status, old.reason, old.message) != (cond.status, cond.reason, cond.message):
        conditions = set_condition(list(dm.status.conditions), cond)
        patch = {"status": {"conditions": [c.model_dump(mode="json") for c in conditions]}}
        try:
            await kube.apatch_status(API_VERSION, KIND, dm.metadata.namespace, dm.metadata.name, patch)
        except KubeError as exc:  # status is a courtesy here; the retry is what matters
            log.warning("could not set Registered on %s/%s: %s", dm.metadata.namespace, dm.metadata.name, exc)
    if retry % EVENT_EVERY == 0:
        await kube.aevent(
            raw, "Warning", "RegistryArchiveFailed",
            f"{cond.message}. The DecisionModel is kept until its versions are archived in the Model Registry; "
            f"retrying in {delay:.0f}s (docs/operations.md: Deleting a DecisionModel with a registry)",
        )


async def _namespace_terminating(kube: Any, namespace: str) -> bool:
    try:
        ns = await kube.aget(CORE_API, "Namespace", None, namespace)
    except KubeError:
        return False  # cannot tell: keep the safe answer (retry)
    return bool(ns and (ns.get("metadata") or {}).get("deletionTimestamp"))


def finalizers(raw: dict[str, Any]) -> list[str]:
    return list((raw.get("metadata") or {}).get("finalizers") or [])


def holds(raw: dict[str, Any]) -> bool:
    return FINALIZER in finalizers(raw)


def add_patch(raw: dict[str, Any]) -> list[dict[str, Any]] | None:
    """JSON patch adding the finalizer (None: already held). Guarded by the resourceVersion read."""
    if holds(raw):
        return None
    rv = {"op": "test", "path": "/metadata/resourceVersion", "value": raw["metadata"]["resourceVersion"]}
    if not finalizers(raw):
        return [rv, {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    return [rv, {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def remove_patch(raw: dict[str, Any]) -> list[dict[str, Any]] | None:
    """JSON patch removing our finalizer and nothing else (None: not held); each removal tests the value at its index
    first, so a list someone changed meanwhile makes the patch fail instead of removing theirs."""
    ops: list[dict[str, Any]] = []
    for i, f in sorted(enumerate(finalizers(raw)), reverse=True):
        if f == FINALIZER:
            path = f"/metadata/finalizers/{i}"
            ops += [{"op": "test", "path": path, "value": f}, {"op": "remove", "path": path}]
    return ops or None


class RegistryFinalizer:
    """Called by the reconcile for every DecisionModel it reads (see reconcile.Reconciler)."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.retries: dict[str, int] = {}

    async def _patch(self, raw: dict[str, Any], ops: list[dict[str, Any]]) -> None:
        meta = raw["metadata"]
        await self.kube.apatch(API_VERSION, KIND, meta["namespace"], meta["name"], ops, "application/json-patch+json")

    async def keep(self, raw: dict[str, Any], dm: DecisionModel) -> None:
        """A live DecisionModel: hold the finalizer exactly while spec.registry is set."""
        ops = add_patch(raw) if dm.spec.registry is not None else remove_patch(raw)
        if ops:
            await self._patch(raw, ops)

    async def finalize(self, raw: dict[str, Any], now: datetime) -> float | None:
        """A DecisionModel being deleted that holds our finalizer: archive, then let it go. Returns the seconds
        until the next attempt (None: done, the finalizer is removed)."""
        meta = raw["metadata"]
        uid = meta.get("uid", "")
        retry = self.retries.get(uid, 0)
        delay = await self._archive(raw, retry, now)
        if delay is not None:
            self.retries[uid] = retry + 1
            return delay
        self.retries.pop(uid, None)
        ops = remove_patch(raw)
        if ops:
            try:
                await self._patch(raw, ops)
            except KubeError as exc:
                if exc.status != 404:
                    raise
        return None

    async def _archive(self, raw: dict[str, Any], retry: int, now: datetime) -> float | None:
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        try:
            dm = DecisionModel.model_validate(raw)
        except Exception as exc:  # a spec this operator cannot read (version skew): never block the delete for it
            log.error("%s/%s cannot be read (%s); letting it go without archiving", namespace, name, exc)
            return None
        kube = self.kube
        mark_deleting(dm.metadata.uid)  # first: a reconcile that gets the registry lock after this writes nothing
        target = await resolve_registry(kube, dm, now)
        if target is None:  # spec.registry removed meanwhile: nothing to archive
            return None
        delay = retry_delay(retry)
        # Nothing registered is recorded in status (a typo'd URL, a ModelRegistry that never existed): when the
        # registry cannot be asked, there is nothing known to archive, and holding the object would block it for good.
        recorded = any(v.modelVersionId for v in dm.status.versions)
        if target.error is not None:
            if not recorded:
                log.info("%s/%s deleted: no registry entry recorded in status and the registry cannot be found (%s); "
                         "nothing to archive", namespace, name, target.error.message)
                return None
            if await _namespace_terminating(kube, namespace):
                log.warning(
                    "%s/%s: namespace is being deleted and the registry cannot be reached (%s); its versions stay "
                    "LIVE in the Model Registry: archive them there by hand", namespace, name, target.error.message,
                )
                return None
            await _report(kube, raw, dm, target.error, retry, delay)
            return delay
        async with registry_lock(dm.metadata.uid), target.client() as client:
            result = await archive_all(client, dm, now)
        if not result.ok and not recorded:
            log.info("%s/%s deleted: no registry entry recorded in status and the registry cannot be asked (%s); "
                     "nothing to archive", namespace, name, result.condition.message)
            forget(dm.metadata.uid)
            return None
        if not result.ok:
            await _report(kube, raw, dm, result.condition, retry, delay)
            return delay
        forget(dm.metadata.uid)
        log.info("%s/%s deleted: archived %s in the Model Registry", namespace, name,
                 ", ".join(result.archived) or "nothing (no LIVE version of it was registered)")
        return None
