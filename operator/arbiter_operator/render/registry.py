"""Model Registry entries a DecisionModel needs, and the `Registered` condition (pure: no I/O).

Layout in the registry (one RegisteredModel per `spec.model.name`, shared by every DecisionModel naming it):
  RegisteredModel  name = spec.model.name
    ModelVersion   name = spec.versions[].name, governance metadata + provenance in customProperties
      ModelArtifact name = the version name, uri = storageUri, modelFormatName = spec.model.format

Idempotency: the RegisteredModel is found by name, the ModelVersion and ModelArtifact by an `externalId` Arbiter sets
(`arbiter:<model>:<version>` and `...:model-artifact`), and entries are patched only where they differ: nothing is
created twice. (externalId rather than name-within-parent because registry v0.3.0 on PostgreSQL answers 500 to every
parent-scoped query; externalIds are unique per registry across all entity types, hence the suffix.) Versions are
never deleted: a version removed from the spec, or every version when the DecisionModel is deleted, is set to state
ARCHIVED so the audit trail stays. Only versions whose provenance names this DecisionModel (namespace/name) are
touched; a LIVE version registered by another DecisionModel is reported as `RegistryRejected` instead of being taken
over. `sync/registry.py` does the writing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..api.conditions import REGISTERED, Condition, get_condition, make_condition
from ..api.models import DecisionModel, ModelVersion
from ..api.registry_values import to_custom_properties

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
    def of(cls, dm: DecisionModel) -> Owner:
        m = dm.metadata
        return cls(namespace=m.namespace, name=m.name, uid=m.uid, generation=m.generation)

    def properties(self) -> dict[str, str | int | float | bool]:
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
    now: datetime,
    *,
    registered: list[str] | None = None,
    rejected: str | None = None,
    unreachable: str | None = None,
    refused: str | None = None,
) -> Condition:
    if refused is not None:
        return make_condition(REGISTERED, "False", REASON_REGISTRATION_REJECTED, refused, generation, now)
    if unreachable is not None:
        return make_condition(
            REGISTERED, "Unknown", REASON_UNREACHABLE,
            f"{unreachable}; retrying with backoff. Serving is not affected.", generation, now,
        )
    if rejected is not None:
        return make_condition(REGISTERED, "False", REASON_REJECTED, rejected, generation, now)
    names = ", ".join(registered or [])
    return make_condition(
        REGISTERED, "True", REASON_REGISTERED, f"versions {names} are registered in the Model Registry", generation,
        now,
    )


def registry_ids(result: RegistryResult) -> dict[str, dict[str, str]]:
    """Per version, the ids in the shape of `VersionStatus` (registeredModelId, modelVersionId, modelArtifactId)."""
    return {
        v: {"registeredModelId": r.registered_model_id, "modelVersionId": r.model_version_id,
            "modelArtifactId": r.model_artifact_id}
        for v, r in result.versions.items()
    }


def permanently_refused(dm: DecisionModel) -> Condition | None:
    """The `RegistrationRejected` condition, when status holds it for the generation being reconciled (the status
    read is from before this reconcile, so after a spec change its observedGeneration is the older one)."""
    c = get_condition(dm.status.conditions, REGISTERED)
    if c is not None and c.reason == REASON_REGISTRATION_REJECTED and c.observedGeneration == dm.metadata.generation:
        return c
    return None
