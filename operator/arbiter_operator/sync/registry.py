"""The one write outside the cluster: make the Model Registry hold a DecisionModel's versions (and archive them
when it is deleted). A named step of the reconcile (`sync_registry_step`), and the delete finalizer's `archive_all`.

Every registry write goes through `clients.registry.RegistryClient`; what to write comes from `render.registry`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..api.conditions import REGISTERED, make_condition
from ..api.models import DecisionModel
from ..api.registry_values import to_custom_properties
from ..clients.registry import (
    ModelArtifact,
    RegisteredModel,
    RegistrationRefused,
    RegistryClient,
    RegistryRejected,
    RegistryUnreachable,
)
from ..observe.registry import resolve_registry
from ..plan.model import Observations
from ..render.registry import (
    ARCHIVED,
    LIVE,
    REASON_ARCHIVED,
    DesiredModel,
    DesiredVersion,
    Owner,
    RegistryResult,
    VersionRegistration,
    desired_model,
    foreign_owner,
    permanently_refused,
    properties_patch,
    registered_condition,
    registry_ids,
    versions_to_archive,
)


async def _ensure_registered_model(client: RegistryClient, want: DesiredModel, owner: Owner,
                                   result: RegistryResult) -> RegisteredModel:
    rm = await client.find_registered_model(name=want.name)
    if rm is None:
        body: dict[str, Any] = {"name": want.name, "customProperties": to_custom_properties(want.properties)}
        if want.description:
            body["description"] = want.description
        rm = await client.create_registered_model(body)
        result.created.append(f"RegisteredModel {want.name}")
        return rm
    patch: dict[str, Any] = {}
    if rm.state == ARCHIVED:
        patch["state"] = LIVE  # a version is live again: so is its model
    if want.description and rm.raw.get("description") != want.description:
        patch["description"] = want.description
    # Provenance on the shared RegisteredModel: only set when nobody else owns it (first come keeps it).
    if foreign_owner(rm.custom_properties, owner) is None:
        props = properties_patch(rm.raw.get("customProperties") or {}, want.properties)
        if props is not None:
            patch["customProperties"] = props
    if patch:
        rm = await client.update_registered_model(rm.id, patch)
        result.updated.append(f"RegisteredModel {want.name}")
    return rm


async def _ensure_version(
    client: RegistryClient, rm_id: str, model_name: str, want: DesiredVersion, owner: Owner, result: RegistryResult
) -> VersionRegistration:
    mv = await client.find_model_version(external_id=want.external_id)
    if mv is None:
        mv = await client.create_model_version(
            {
                "name": want.name,
                "registeredModelId": rm_id,
                "externalId": want.external_id,
                "state": LIVE,
                "customProperties": to_custom_properties(want.properties),
            }
        )
        result.created.append(f"ModelVersion {model_name}/{want.name}")
    else:
        other = foreign_owner(mv.custom_properties, owner)
        if other is not None and mv.state != ARCHIVED:
            raise RegistryRejected(
                409, "PATCH", f"/model_versions/{mv.id}",
                f"version {want.name} of model {model_name} is registered by DecisionModel {other}; "
                "give this version another name or remove it there first",
            )
        patch: dict[str, Any] = {}
        if mv.state != LIVE:
            patch["state"] = LIVE
        props = properties_patch(mv.raw.get("customProperties") or {}, want.properties)
        if props is not None:
            patch["customProperties"] = props
        if patch:
            mv = await client.update_model_version(mv.id, patch)
            result.updated.append(f"ModelVersion {model_name}/{want.name}")

    art = await _ensure_artifact(client, mv.id, model_name, want, result)
    return VersionRegistration(
        version=want.name, registered_model_id=rm_id, model_version_id=mv.id, model_artifact_id=art.id
    )


async def _ensure_artifact(
    client: RegistryClient, mv_id: str, model_name: str, want: DesiredVersion, result: RegistryResult
) -> ModelArtifact:
    art = await client.find_model_artifact(external_id=want.artifact_external_id)
    if art is None:
        art = await client.create_model_version_artifact(
            mv_id,
            {
                "name": want.name,
                "externalId": want.artifact_external_id,
                "uri": want.storage_uri,
                "modelFormatName": want.model_format,
                "state": LIVE,
            },
        )
        result.created.append(f"ModelArtifact {model_name}/{want.name}")
        return art
    patch: dict[str, Any] = {}
    if art.uri != want.storage_uri:
        patch["uri"] = want.storage_uri
    if art.model_format_name != want.model_format:
        patch["modelFormatName"] = want.model_format
    if patch:
        art = await client.update_model_artifact(art.id, patch)
        result.updated.append(f"ModelArtifact {model_name}/{want.name}")
    return art


async def _archive(client: RegistryClient, rm_id: str, keep: set[str], owner: Owner, result: RegistryResult) -> None:
    existing = await client.list_model_versions(rm_id)
    for mv in versions_to_archive(existing, keep, owner):
        await client.update_model_version(mv.id, {"state": ARCHIVED})
        result.archived.append(mv.name)


async def sync_registry(client: RegistryClient, dm: DecisionModel, now: datetime) -> RegistryResult:
    """Make the registry hold every version of `dm`, archive the ones removed from the spec.

    Never raises for registry trouble: the outcome is in `result.condition` (True / False RegistryRejected /
    Unknown RegistryUnreachable); ids of the versions done before a failure are still returned.
    """
    owner = Owner.of(dm)
    want = desired_model(dm)
    gen = dm.metadata.generation
    result = RegistryResult(condition=registered_condition(gen, now, registered=[]))
    try:
        rm = await _ensure_registered_model(client, want, owner, result)
        for v in want.versions:
            result.versions[v.name] = await _ensure_version(client, rm.id, want.name, v, owner, result)
        await _archive(client, rm.id, {v.name for v in want.versions}, owner, result)
    except RegistryUnreachable as exc:
        result.condition = registered_condition(gen, now, unreachable=str(exc))
        return result
    except RegistrationRefused as exc:
        result.condition = registered_condition(
            gen, now, refused=f"the Model Registry refuses what was sent ({exc}); retrying cannot help: change the "
            "version's metadata, or ask the registry's operators. Serving is not affected",
        )
        return result
    except RegistryRejected as exc:
        result.condition = registered_condition(
            gen, now, rejected=f"{exc}; fix spec.registry (URL, token, CA) or the version named in this message"
        )
        return result
    result.condition = registered_condition(gen, now, registered=[v.name for v in want.versions])
    return result


async def archive_all(client: RegistryClient, dm: DecisionModel, now: datetime) -> RegistryResult:
    """For the delete finalizer: archive every version this DecisionModel registered (nothing is deleted).

    The RegisteredModel is archived too when it carries this DecisionModel's provenance and no LIVE version is left.
    `result.ok` tells the finalizer whether it may let the object go.
    """
    owner = Owner.of(dm)
    gen = dm.metadata.generation
    result = RegistryResult(condition=registered_condition(gen, now, registered=[]))
    try:
        rm = await client.find_registered_model(name=dm.spec.model.name)
        if rm is not None:
            await _archive(client, rm.id, set(), owner, result)
            remaining = await client.list_model_versions(rm.id)
            if rm.state != ARCHIVED and owner.owns(rm.custom_properties) and all(
                v.state == ARCHIVED for v in remaining
            ):
                await client.update_registered_model(rm.id, {"state": ARCHIVED})
                result.archived.append(f"RegisteredModel {rm.name}")
    except RegistryUnreachable as exc:
        result.condition = registered_condition(gen, now, unreachable=str(exc))
        return result
    except RegistryRejected as exc:
        result.condition = registered_condition(gen, now, rejected=str(exc))
        return result
    # True: archiving is done and the finalizer may let the object go.
    result.condition = make_condition(
        REGISTERED, "True", REASON_ARCHIVED,
        f"the DecisionModel is being deleted; archived {', '.join(result.archived) or 'nothing'} in the registry",
        gen,
        now,
    )
    return result


# ---------------------------------------------------------------- one writer per DecisionModel

# The reconcile (observe_registry) and the delete finalizer (registry_handlers) run in the same process on different
# triggers. A reconcile that read the DecisionModel just before it was deleted would otherwise set versions LIVE again
# right after the finalizer archived them. Per DecisionModel (uid): one lock around every registry write, and a mark
# the finalizer sets before it waits for the lock, so any sync that gets the lock after it writes nothing.
_LOCKS: dict[str, asyncio.Lock] = {}
_DELETING: dict[str, None] = {}  # insertion-ordered set of uids, bounded
_DELETING_MAX = 10_000


def registry_lock(uid: str) -> asyncio.Lock:
    lock = _LOCKS.get(uid)
    if lock is None:
        lock = _LOCKS[uid] = asyncio.Lock()
    return lock


def mark_deleting(uid: str) -> None:
    _DELETING[uid] = None
    while len(_DELETING) > _DELETING_MAX:
        _DELETING.pop(next(iter(_DELETING)))


def forget(uid: str) -> None:
    """The DecisionModel is archived and gone: drop its lock (the deleting mark stays, bounded)."""
    _LOCKS.pop(uid, None)


# ---------------------------------------------------------------- the reconcile's step


async def sync_registry_step(kube: Any, dm: DecisionModel, obs: Observations, now: datetime) -> Observations:
    """The reconcile's registry step: write what `render.registry` wants, and return the observations with the
    registry ids per version and the `Registered` condition. Never raises for registry trouble (a condition says it).

    Ids already in status are kept for versions the registry could not be asked about (outage): they label the
    InferenceServices, and dropping them would change what serves.
    """
    target = await resolve_registry(kube, dm, now)
    if target is None:
        return obs
    ids = {
        v.name: {k: getattr(v, k) for k in ("registeredModelId", "modelVersionId", "modelArtifactId") if getattr(v, k)}
        for v in dm.status.versions
        if v.registeredModelId and v.name in {sv.name for sv in dm.spec.versions}
    }
    if target.error is not None:
        return replace(obs, registry_ids=ids, extra_conditions=(*tuple(obs.extra_conditions), target.error))
    refused = permanently_refused(dm)
    if refused is not None:  # the registry refused this very spec for good: asking again cannot change its answer
        return replace(obs, registry_ids=ids, extra_conditions=(*tuple(obs.extra_conditions), refused))
    async with registry_lock(dm.metadata.uid):
        if dm.metadata.uid in _DELETING:  # the finalizer is archiving: write nothing, say nothing new
            return replace(obs, registry_ids=ids)
        async with target.client() as client:
            result = await sync_registry(client, dm, now)
    ids.update(registry_ids(result))
    return replace(obs, registry_ids=ids, extra_conditions=(*tuple(obs.extra_conditions), result.condition))
