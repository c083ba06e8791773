"""Thin kopf glue for the Model Registry's delete path: deleting a DecisionModel archives its versions in the registry.

The registry lives outside the cluster, so owner references cannot clean it up: a finalizer holds the DecisionModel
until `registration.archive_all` has set every version it registered to ARCHIVED (nothing is deleted: the audit trail
stays). The handler is filtered on `spec.registry` being present, and kopf adds its finalizer only to objects that
match an on-delete handler's filters (and removes it again when `spec.registry` is taken out), so a DecisionModel
without a registry carries no finalizer and sees no write from this module at all.

Registry down, or refusing (a revoked token): kopf.TemporaryError with a growing delay (5 s doubling, at most 5 min),
the `Registered` condition says why, a Warning event now and then. The escape hatch for SREs (remove the finalizer
by hand, which leaves the entries LIVE) is in docs/operations.md ("Deleting a DecisionModel with a registry").
The object is let go without archiving in two cases, because nothing would ever unblock it: status records no
registry entry and the registry cannot be asked (it never registered anything: a typo'd URL, a ModelRegistry that
never existed), or the namespace itself is being deleted and the registry's references (token Secret, CA ConfigMap,
ModelRegistry) are already gone; in the second case the entries stay LIVE and the log says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from .api.conditions import REGISTERED, get_condition, set_condition
from .api.models import API_VERSION, GROUP, KIND, PLURAL, VERSION, DecisionModel
from .clients.kube import KubeError, RestKubeClient
from .registration import archive_all, forget, mark_deleting, registry_lock, resolve_registry

log = logging.getLogger("arbiter.registry")

KUBE_KEY = "arbiter_registry_kube"
FIRST_DELAY = 5.0
MAX_DELAY = 300.0
EVENT_EVERY = 6  # retries between repeated Warning events (about every 30 min once the delay is at its cap)


def retry_delay(retry: int) -> float:
    """Seconds before the next attempt after `retry` failed ones: 5, 10, 20, ... capped at 5 min."""
    return min(MAX_DELAY, FIRST_DELAY * 2 ** min(retry, 16))


def _kube(memo: kopf.Memo) -> Any:
    kube = memo.get(KUBE_KEY)
    if kube is None:
        kube = memo[KUBE_KEY] = RestKubeClient()
    return kube


async def _report(kube: Any, raw: dict[str, Any], dm: DecisionModel, cond: Any, retry: int, delay: float) -> None:
    """Registered condition on the object being deleted (its reconcile no longer runs), and a Warning event."""
    old = get_condition(dm.status.conditions, REGISTERED)
    if old is None or (old.status, old.reason, old.message) != (cond.status, cond.reason, cond.message):
        conditions = set_condition(list(dm.status.conditions), cond)
        patch = {"status": {"conditions": [c.model_dump(mode="json") for c in conditions]}}
        try:
            await asyncio.to_thread(kube.patch_status, API_VERSION, KIND, dm.metadata.namespace, dm.metadata.name,
                                    patch)
        except KubeError as exc:  # status is a courtesy here; the retry is what matters
            log.warning("could not set Registered on %s/%s: %s", dm.metadata.namespace, dm.metadata.name, exc)
    if retry % EVENT_EVERY == 0:
        await asyncio.to_thread(
            kube.event, raw, "Warning", "RegistryArchiveFailed",
            f"{cond.message}. The DecisionModel is kept until its versions are archived in the Model Registry; "
            f"retrying in {delay:.0f}s (docs/operations.md: Deleting a DecisionModel with a registry)",
        )


async def _namespace_terminating(kube: Any, namespace: str) -> bool:
    try:
        ns = await asyncio.to_thread(kube.get, "v1", "Namespace", None, namespace)
    except KubeError:
        return False  # cannot tell: keep the safe answer (retry)
    return bool(ns and (ns.get("metadata") or {}).get("deletionTimestamp"))


@kopf.on.delete(GROUP, VERSION, PLURAL, id="registry-archive", field="spec.registry", value=kopf.PRESENT)
async def archive_on_delete(
    body: kopf.Body, namespace: str, name: str, retry: int, memo: kopf.Memo, **_: Any
) -> None:
    kube = _kube(memo)
    raw = {k: body[k] for k in body}  # plain dict: the kube client posts events about it
    dm = DecisionModel.model_validate(raw)
    mark_deleting(dm.metadata.uid)  # first: a reconcile that gets the registry lock after this writes nothing
    target = await resolve_registry(kube, dm)
    if target is None:  # spec.registry removed meanwhile: the filter will drop the finalizer too
        return
    delay = retry_delay(retry)
    # Nothing registered is recorded in status (a typo'd URL, a ModelRegistry that never existed): when the registry
    # cannot be asked, there is nothing known to archive, and holding the object would block it for good.
    recorded = any(v.modelVersionId for v in dm.status.versions)
    if target.error is not None:
        if not recorded:
            log.info("%s/%s deleted: no registry entry recorded in status and the registry cannot be found (%s); "
                     "nothing to archive", namespace, name, target.error.message)
            return
        if await _namespace_terminating(kube, namespace):
            log.warning(
                "%s/%s: namespace is being deleted and the registry cannot be reached (%s); its versions stay LIVE "
                "in the Model Registry: archive them there by hand", namespace, name, target.error.message,
            )
            return
        await _report(kube, raw, dm, target.error, retry, delay)
        raise kopf.TemporaryError(target.error.message, delay=delay)
    async with registry_lock(dm.metadata.uid), target.client() as client:
        result = await archive_all(client, dm)
    if not result.ok and not recorded:
        log.info("%s/%s deleted: no registry entry recorded in status and the registry cannot be asked (%s); "
                 "nothing to archive", namespace, name, result.condition.message)
        forget(dm.metadata.uid)
        return
    if not result.ok:
        await _report(kube, raw, dm, result.condition, retry, delay)
        raise kopf.TemporaryError(result.condition.message, delay=delay)
    forget(dm.metadata.uid)
    log.info("%s/%s deleted: archived %s in the Model Registry", namespace, name,
             ", ".join(result.archived) or "nothing (no LIVE version of it was registered)")
