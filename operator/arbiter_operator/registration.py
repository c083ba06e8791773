"""Model Registry entries for a DecisionModel: what must exist, what to archive, and the `Registered` condition.

The pure part (no I/O) turns a DecisionModel into the registry entries it needs and compares them with what the
registry holds. `sync_registry` / `archive_all` are the only functions that talk to the registry, through
`clients.registry.RegistryClient`.

Layout in the registry (one RegisteredModel per `spec.model.name`, shared by every DecisionModel naming it):
  RegisteredModel  name = spec.model.name
    ModelVersion   name = spec.versions[].name, governance metadata + provenance in customProperties
      ModelArtifact name = the version name, uri = storageUri, modelFormatName = spec.model.format

Idempotency: the RegisteredModel is found by name, the ModelVersion and ModelArtifact by an `externalId` Arbiter sets
(`arbiter:<model>:<version>` and `...:model-artifact`), and entries are patched only where they differ: nothing is
created twice. (externalId rather than name-within-parent because registry v0.3.0 on PostgreSQL answers 500 to every
parent-scoped query; externalIds are unique per registry across all entity types, hence the suffix.) Versions are never deleted: a version removed from the spec, or every version when the
DecisionModel is deleted, is set to state ARCHIVED so the audit trail stays. Only versions whose provenance names
this DecisionModel (namespace/name) are touched; a LIVE version registered by another DecisionModel is reported as
`RegistryRejected` instead of being taken over.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from .api.conditions import REGISTERED, Condition, make_condition
from .api.models import DecisionModel, ModelVersion
from .clients.kube import KubeError
from .clients.registry import (
    ModelArtifact,
    RegistrationRefused,
    RegistryClient,
    RegistryRejected,
    RegistryUnreachable,
    to_custom_properties,
)

# Reasons of the `Registered` condition (docs/registry.md lists them).
REASON_REGISTERED = "Registered"
REASON_REJECTED = "RegistryRejected"
REASON_REGISTRATION_REJECTED = "RegistrationRejected"  # the registry refuses the data itself: permanent
REASON_UNREACHABLE = "RegistryUnreachable"
REASON_ARCHIVED = "Archived"

# customProperties keys. Prefixed so they never collide with what people add in the OpenShift AI dashboard.
P = "arbiter."
KEY_INPUT_SCHEMA = P + "input_schema"
KEY_OUTPUT_SCHEMA = P + "output_schema"
KEY_SLA_P95_MS = P + "sla_p95_latency_ms"
# The decision-quality bounds a version promises (metadata.sla), recorded only when set; the promotion analysis
# defaults its gates to them.
KEY_SLA_BOUNDS = {
    "maxFallbackRate": P + "sla_max_fallback_rate",
    "maxSchemaViolationRate": P + "sla_max_schema_violation_rate",
    "maxLowConfidenceRate": P + "sla_max_low_confidence_rate",
}
KEY_TRAINING_FROM = P + "training_data_from"
KEY_TRAINING_TO = P + "training_data_to"
KEY_BIAS_REPORT = P + "bias_report_url"
KEY_NAMESPACE = P + "decisionmodel_namespace"
KEY_NAME = P + "decisionmodel_name"
KEY_UID = P + "decisionmodel_uid"
KEY_GENERATION = P + "decisionmodel_generation"
KEY_STORAGE_URI = P + "storage_uri"
KEY_TOKENS_PER_DECISION = P + "tokens_per_decision"

# Labels OpenShift AI reads to link a deployment to its registry entry.
LABEL_REGISTERED_MODEL_ID = "modelregistry.opendatahub.io/registered-model-id"
LABEL_MODEL_VERSION_ID = "modelregistry.opendatahub.io/model-version-id"
LABEL_REGISTRY_NAME = "modelregistry.opendatahub.io/name"

LIVE = "LIVE"
ARCHIVED = "ARCHIVED"


# ---------------------------------------------------------------- pure: desired entries


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    uid: str
    generation: int

    @classmethod
    def of(cls, dm: DecisionModel) -> "Owner":
        m = dm.metadata
        return cls(namespace=m.namespace, name=m.name, uid=m.uid, generation=m.generation)

    def properties(self) -> dict[str, str | int]:
        return {
            KEY_NAMESPACE: self.namespace,
            KEY_NAME: self.name,
            KEY_UID: self.uid,
            KEY_GENERATION: self.generation,
        }

    def owns(self, custom_properties: dict[str, Any]) -> bool:
        return (
            custom_properties.get(KEY_NAMESPACE) == self.namespace and custom_properties.get(KEY_NAME) == self.name
        )


@dataclass(frozen=True)
class DesiredVersion:
    name: str
    storage_uri: str
    model_format: str
    properties: dict[str, str | int | float | bool]
    external_id: str
    artifact_external_id: str


def version_external_id(model: str, version: str) -> str:
    return f"arbiter:{model}:{version}"


def artifact_external_id(model: str, version: str) -> str:
    return f"arbiter:{model}:{version}:model-artifact"


@dataclass(frozen=True)
class DesiredModel:
    name: str
    description: str | None
    properties: dict[str, str | int | float | bool]
    versions: tuple[DesiredVersion, ...]


def _json_text(value: Any) -> str:
    # Sorted and compact: the same schema always gives the same text, so an unchanged spec never causes a PATCH.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# The largest string value sent as a custom property. The registry on PostgreSQL indexes property strings, and an
# index row holds at most 2,704 bytes (after compression, which text with little repetition does not get); larger
# values are refused with a 500. 2,048 bytes leaves room for the row's own overhead.
MAX_PROPERTY_BYTES = 2048


def schema_reference_uri(owner: Owner, version: str, field: str) -> str:
    """Where a schema too large for a property lives: the DecisionModel's own spec, in the cluster."""
    return (f"kubernetes:///apis/arbiter.dev/v1alpha1/namespaces/{owner.namespace}/decisionmodels/{owner.name}"
            f"#spec.versions[name={version}].metadata.{field}")


def fitted(text: str, uri: str) -> str:
    """`text` itself when it fits a property; otherwise a reference to it with its digest, as JSON: the registry holds
    what identifies the content exactly, and anyone with the spec can check it (sha256 of the UTF-8 text, sorted keys
    and compact separators as sent)."""
    data = text.encode()
    if len(data) <= MAX_PROPERTY_BYTES:
        return text
    return _json_text({"$ref": uri, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})


def version_properties(version: ModelVersion, owner: Owner,
                       tokens_per_decision: int | None = None) -> dict[str, str | int | float | bool]:
    md = version.metadata
    tokens = {KEY_TOKENS_PER_DECISION: tokens_per_decision} if tokens_per_decision else {}
    bounds = {key: float(getattr(md.sla, field)) for field, key in KEY_SLA_BOUNDS.items()
              if getattr(md.sla, field) is not None}
    return {
        **tokens,
        **bounds,
        KEY_INPUT_SCHEMA: fitted(_json_text(md.inputSchema), schema_reference_uri(owner, version.name, "inputSchema")),
        KEY_OUTPUT_SCHEMA: fitted(_json_text(md.outputSchema),
                                  schema_reference_uri(owner, version.name, "outputSchema")),
        KEY_SLA_P95_MS: float(md.sla.p95LatencyMs),
        KEY_TRAINING_FROM: md.trainingData.from_,
        KEY_TRAINING_TO: md.trainingData.to,
        KEY_BIAS_REPORT: md.biasReportUrl,
        KEY_STORAGE_URI: version.storageUri,
        **owner.properties(),
    }


def desired_model(dm: DecisionModel) -> DesiredModel:
    owner = Owner.of(dm)
    spec = dm.spec
    tokens = {s.name: s.tokensPerDecision for s in dm.status.versions} if dm.status else {}
    return DesiredModel(
        name=spec.model.name,
        description=spec.model.description,
        properties=owner.properties(),
        versions=tuple(
            DesiredVersion(
                name=v.name,
                storage_uri=v.storageUri,
                model_format=spec.model.format,
                # Known once the artifact check counted it (status.versions[].tokensPerDecision).
                properties=version_properties(v, owner, tokens.get(v.name)),
                external_id=version_external_id(spec.model.name, v.name),
                artifact_external_id=artifact_external_id(spec.model.name, v.name),
            )
            for v in spec.versions
        ),
    )


def properties_patch(
    existing_raw: dict[str, Any], desired: dict[str, str | int | float | bool]
) -> dict[str, Any] | None:
    """The customProperties to send, or None when the registry already holds `desired`.

    Keys Arbiter does not own are kept as they are: people add labels and notes in the dashboard.
    """
    current = dict(existing_raw or {})
    typed = to_custom_properties(desired)
    if all(_same_value(current.get(k), v) for k, v in typed.items()):
        return None
    current.update(typed)
    return current


def _same_value(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    if not old or old.get("metadataType") != new.get("metadataType"):
        return False
    if new["metadataType"] == "MetadataDoubleValue":
        return float(old.get("double_value", "nan")) == float(new["double_value"])
    return {k: str(v) for k, v in old.items()} == {k: str(v) for k, v in new.items()}


def foreign_owner(custom_properties: dict[str, Any], owner: Owner) -> str | None:
    """`namespace/name` of another DecisionModel that registered this entry, if any."""
    ns, name = custom_properties.get(KEY_NAMESPACE), custom_properties.get(KEY_NAME)
    if ns is None and name is None:
        return None
    if ns == owner.namespace and name == owner.name:
        return None
    return f"{ns}/{name}"


def versions_to_archive(existing: Iterable[Any], keep: set[str], owner: Owner) -> list[Any]:
    """LIVE versions this DecisionModel registered that are not in `keep` (version names)."""
    return [
        v
        for v in existing
        if v.state != ARCHIVED and v.name not in keep and owner.owns(v.custom_properties)
    ]


def isvc_registry_labels(
    registered_model_id: str | None, model_version_id: str | None, registry_name: str | None = None
) -> dict[str, str]:
    """Labels for a version's InferenceService (empty until the version is registered)."""
    if not registered_model_id or not model_version_id:
        return {}
    labels = {LABEL_REGISTERED_MODEL_ID: registered_model_id, LABEL_MODEL_VERSION_ID: model_version_id}
    if registry_name:
        labels[LABEL_REGISTRY_NAME] = registry_name
    return labels


def registry_url_from_model_registry(obj: dict[str, Any]) -> str:
    """REST base URL of a `ModelRegistry` (modelregistry.opendatahub.io) from its spec and status.

    The operator's status lists the hosts it serves on; in-cluster, the Service host (`*.svc...`) is used. With
    kube-rbac-proxy or the OAuth proxy in front (OpenShift AI's default) the endpoint is HTTPS on the proxy port;
    without, plain HTTP on the REST port. Raises ValueError with what is missing.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ref = f"ModelRegistry {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    hosts: list[str] = list(status.get("hosts") or [])
    if not hosts and status.get("hostsStr"):
        hosts = [h.strip() for h in str(status["hostsStr"]).split(",") if h.strip()]
    if not hosts:
        raise ValueError(
            f"{ref} has no status.hosts yet; wait until the registry is Available or set spec.registry.url"
        )
    svc = [h for h in hosts if ".svc" in h]
    host = (svc or hosts)[0]
    proxy = spec.get("kubeRBACProxy") or spec.get("oauthProxy")
    if proxy is not None:
        return f"https://{host}:{int(proxy.get('port') or 8443)}"
    rest = spec.get("rest") or {}
    return f"http://{host}:{int(rest.get('port') or 8080)}"


# ---------------------------------------------------------------- results and the condition


@dataclass(frozen=True)
class VersionRegistration:
    version: str
    registered_model_id: str
    model_version_id: str
    model_artifact_id: str


@dataclass
class RegistryResult:
    """What `sync_registry` found and did. `condition` is the `Registered` condition to set."""

    condition: Condition
    versions: dict[str, VersionRegistration] = field(default_factory=dict)
    archived: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.condition.status == "True"


def registered_condition(
    generation: int,
    *,
    registered: list[str] | None = None,
    rejected: str | None = None,
    unreachable: str | None = None,
    refused: str | None = None,
) -> Condition:
    if refused is not None:
        return make_condition(REGISTERED, "False", REASON_REGISTRATION_REJECTED, refused, generation)
    if unreachable is not None:
        return make_condition(
            REGISTERED, "Unknown", REASON_UNREACHABLE,
            f"{unreachable}; retrying with backoff. Serving is not affected.", generation,
        )
    if rejected is not None:
        return make_condition(REGISTERED, "False", REASON_REJECTED, rejected, generation)
    names = ", ".join(registered or [])
    return make_condition(
        REGISTERED, "True", REASON_REGISTERED, f"versions {names} are registered in the Model Registry", generation
    )


def registry_ids(result: RegistryResult) -> dict[str, dict[str, str]]:
    """Per version, the ids in the shape of `VersionStatus` (registeredModelId, modelVersionId, modelArtifactId)."""
    return {
        v: {"registeredModelId": r.registered_model_id, "modelVersionId": r.model_version_id,
            "modelArtifactId": r.model_artifact_id}
        for v, r in result.versions.items()
    }


# ---------------------------------------------------------------- I/O: sync and archive


async def _ensure_registered_model(client: RegistryClient, want: DesiredModel, owner: Owner, result: RegistryResult):
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


async def sync_registry(client: RegistryClient, dm: DecisionModel) -> RegistryResult:
    """Make the registry hold every version of `dm`, archive the ones removed from the spec.

    Never raises for registry trouble: the outcome is in `result.condition` (True / False RegistryRejected /
    Unknown RegistryUnreachable); ids of the versions done before a failure are still returned.
    """
    owner = Owner.of(dm)
    want = desired_model(dm)
    gen = dm.metadata.generation
    result = RegistryResult(condition=registered_condition(gen, registered=[]))
    try:
        rm = await _ensure_registered_model(client, want, owner, result)
        for v in want.versions:
            result.versions[v.name] = await _ensure_version(client, rm.id, want.name, v, owner, result)
        await _archive(client, rm.id, {v.name for v in want.versions}, owner, result)
    except RegistryUnreachable as exc:
        result.condition = registered_condition(gen, unreachable=str(exc))
        return result
    except RegistrationRefused as exc:
        result.condition = registered_condition(
            gen, refused=f"the Model Registry refuses what was sent ({exc}); retrying cannot help: change the "
            "version's metadata, or ask the registry's operators. Serving is not affected",
        )
        return result
    except RegistryRejected as exc:
        result.condition = registered_condition(
            gen, rejected=f"{exc}; fix spec.registry (URL, token, CA) or the version named in this message"
        )
        return result
    result.condition = registered_condition(gen, registered=[v.name for v in want.versions])
    return result


async def archive_all(client: RegistryClient, dm: DecisionModel) -> RegistryResult:
    """For the delete finalizer: archive every version this DecisionModel registered (nothing is deleted).

    The RegisteredModel is archived too when it carries this DecisionModel's provenance and no LIVE version is left.
    `result.ok` tells the finalizer whether it may let the object go.
    """
    owner = Owner.of(dm)
    gen = dm.metadata.generation
    result = RegistryResult(condition=registered_condition(gen, registered=[]))
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
        result.condition = registered_condition(gen, unreachable=str(exc))
        return result
    except RegistryRejected as exc:
        result.condition = registered_condition(gen, rejected=str(exc))
        return result
    # True: archiving is done and the finalizer may let the object go.
    result.condition = make_condition(
        REGISTERED, "True", REASON_ARCHIVED,
        f"the DecisionModel is being deleted; archived {', '.join(result.archived) or 'nothing'} in the registry",
        gen,
    )
    return result


# ---------------------------------------------------------------- I/O: finding the registry from spec.registry

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class RegistryTarget:
    """Where and how to reach the registry; `error` (a `Registered` condition) when it cannot be worked out."""

    url: str | None = None
    token: str | None = field(default=None, repr=False)
    ca_bundle_pem: str | None = field(default=None, repr=False)
    registry_name: str | None = None  # the ModelRegistry's name, for the InferenceService label
    error: Condition | None = None

    def client(self, timeout: float = 10.0) -> RegistryClient:
        return RegistryClient(self.url or "", token=self.token, ca_bundle_pem=self.ca_bundle_pem, timeout=timeout)


def _read_file(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


async def resolve_registry(kube: Any, dm: DecisionModel, sa_dir: str = SA_DIR) -> RegistryTarget | None:
    """Turn `spec.registry` into URL, token and CA, reading the cluster through `kube` (clients.kube.KubeClient,
    synchronous: run in a thread). None when the DecisionModel names no registry (then there is no `Registered`
    condition at all)."""
    reg = dm.spec.registry
    if reg is None:
        return None
    ns = dm.metadata.namespace
    gen = dm.metadata.generation
    target = RegistryTarget()
    try:
        if reg.modelRegistryRef is not None:
            ref_ns = reg.modelRegistryRef.namespace or ns
            obj = await asyncio.to_thread(
                kube.get, "modelregistry.opendatahub.io/v1beta1", "ModelRegistry", ref_ns, reg.modelRegistryRef.name
            )
            if obj is None:
                target.error = registered_condition(
                    gen, unreachable=f"ModelRegistry {ref_ns}/{reg.modelRegistryRef.name} not found")
                return target
            try:
                target.url = registry_url_from_model_registry(obj)
            except ValueError as exc:
                target.error = registered_condition(gen, unreachable=str(exc))
                return target
            target.registry_name = reg.modelRegistryRef.name
        else:
            target.url = reg.url
        if reg.tokenSecretRef is not None:
            secret = await asyncio.to_thread(kube.get, "v1", "Secret", ns, reg.tokenSecretRef.name)
            key = reg.tokenSecretRef.key or "token"
            raw = ((secret or {}).get("data") or {}).get(key)
            if raw is None:
                target.error = registered_condition(
                    gen, rejected=f"Secret {reg.tokenSecretRef.name} (key {key}) with the registry token not found in "
                    f"namespace {ns}; create it or fix spec.registry.tokenSecretRef")
                return target
            target.token = base64.b64decode(raw).decode().strip()
        else:
            target.token = _read_file(os.path.join(sa_dir, "token"))  # the operator's own identity
        pems = []
        if reg.caBundleConfigMapRef is not None:
            cm = await asyncio.to_thread(kube.get, "v1", "ConfigMap", ns, reg.caBundleConfigMapRef.name)
            key = reg.caBundleConfigMapRef.key or "ca.crt"
            pem = ((cm or {}).get("data") or {}).get(key)
            if pem is None:
                target.error = registered_condition(
                    gen, rejected=f"ConfigMap {reg.caBundleConfigMapRef.name} (key {key}) with the registry CA not "
                    f"found in namespace {ns}; create it or fix spec.registry.caBundleConfigMapRef")
                return target
            pems.append(pem)
        # OpenShift's service CA signs the in-cluster registry endpoints (kube-rbac-proxy); trust it when mounted.
        service_ca = _read_file(os.path.join(sa_dir, "service-ca.crt"))
        if service_ca:
            pems.append(service_ca)
        target.ca_bundle_pem = "\n".join(pems) or None
    except KubeError as exc:  # e.g. 403 reading the Secret: the apiserver's message names no secret value
        target.error = registered_condition(gen, unreachable=f"cannot read spec.registry references ({exc})")
    return target


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


# ---------------------------------------------------------------- the operator's observer hook


def permanently_refused(dm: DecisionModel) -> Condition | None:
    """The `RegistrationRejected` condition, when status holds it for the generation being reconciled (the status
    read is from before this reconcile, so after a spec change its observedGeneration is the older one)."""
    from .api.conditions import get_condition

    c = get_condition(dm.status.conditions, REGISTERED)
    if c is not None and c.reason == REASON_REGISTRATION_REJECTED and c.observedGeneration == dm.metadata.generation:
        return c
    return None


async def observe_registry(kube: Any, dm: DecisionModel, obs: Any) -> Any:
    """Observer hook (see observe.OBSERVERS): registry ids per version + the `Registered` condition.
    Register with `OBSERVERS.append(functools.partial(observe_registry, kube))`.

    Ids already in status are kept for versions the registry could not be asked about (outage): they label the
    InferenceServices, and dropping them would change what serves.
    """
    from dataclasses import replace

    target = await resolve_registry(kube, dm)
    if target is None:
        return obs
    ids = {
        v.name: {k: getattr(v, k) for k in ("registeredModelId", "modelVersionId", "modelArtifactId") if getattr(v, k)}
        for v in dm.status.versions
        if v.registeredModelId and v.name in {sv.name for sv in dm.spec.versions}
    }
    if target.error is not None:
        return replace(obs, registry_ids=ids, extra_conditions=tuple(obs.extra_conditions) + (target.error,))
    refused = permanently_refused(dm)
    if refused is not None:  # the registry refused this very spec for good: asking again cannot change its answer
        return replace(obs, registry_ids=ids, extra_conditions=tuple(obs.extra_conditions) + (refused,))
    async with registry_lock(dm.metadata.uid):
        if dm.metadata.uid in _DELETING:  # the finalizer is archiving: write nothing, say nothing new
            return replace(obs, registry_ids=ids)
        async with target.client() as client:
            result = await sync_registry(client, dm)
    ids.update(registry_ids(result))
    return replace(obs, registry_ids=ids, extra_conditions=tuple(obs.extra_conditions) + (result.condition,))
