"""The DecisionModel API (`arbiter.dev/v1alpha1`): the single source of truth.

Field names are the JSON names (camelCase). `api/crdgen.py` turns these classes into the CRD's OpenAPI schema;
cross-field rules live here as CEL (`x-kubernetes-validations`) next to the fields they guard, so the apiserver
rejects bad input with a message that says what to write instead. What only the operator can judge (CEL syntax of
fallback rules, artifacts on storage) is reported through `Stalled` instead.

Every list and string carries a bound: the apiserver estimates the cost of CEL rules from them and refuses a CRD whose
rules could run unbounded.

This module holds the object itself (DecisionModel, its spec's top level, its status); the spec's parts have modules
of their own (versions.py: model, decision settings, versions; serving.py: serving, exposure, mesh;
registry_storage.py: registry, storage), as do the child names and their limits (child_names.py) and the models'
building blocks (fields.py). Every name is importable from here, which is where the rest of the operator imports it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import JsonDict  # type: ignore[attr-defined]  # pydantic defines it, exports none

from .child_names import (
    HOST_LABEL_SUFFIX,
    ISVC_NAME_PATTERN,
    LABEL_VALUE_MAX,
    MAX_ISVC_NAME,
    MAX_ISVC_NAME_MULTINODE,
    MAX_NAME_PLUS_VERSION,
    MAX_NAME_PLUS_VERSION_MULTINODE,
    NAME_PLUS_VERSION_BEFORE_NAMESPACE,
    NAME_SEPARATOR,
    isvc_name,
    name_plus_version_limit,
    version_slug,
)
from .conditions import Condition
from .fields import (
    MAX_SCHEMA_DEPTH,
    Arg,
    JsonSchemaObject,
    Label,
    LongStr,
    Name,
    ShortStr,
    _cel,
    _checked,
    _Model,
    schema_depth,
)
from .governance import (
    AccessSpec,
    AuditRetention,
    AuditS3,
    AuditSpec,
    ContextRoute,
    NetworkAccess,
    NetworkPeer,
    RoutingSpec,
    ServiceAccountRef,
)
from .names import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .promotion import (
    SEQUENTIAL_FAILURE_LIMIT,
    SEQUENTIAL_NEEDS_MODE,
    Analysis,
    PromoteSpec,
    PromotionStatus,
)
from .registry_storage import DEFAULT_STORAGE_SECRET, LocalRef, ObjectRef, RegistrySpec, StorageSpec
from .serving import (
    DEFAULT_METRICS_READER_SECRET,
    DEFAULT_RUNTIME_IMAGE,
    GPU_PRODUCT_LABEL,
    AwsWebIdentity,
    ExposureSpec,
    MeshSpec,
    Resources,
    ServingSpec,
    Toleration,
    VersionVllm,
    VllmSettings,
    effective_vllm,
    engine_memory_share,
)
from .versions import (
    DecisionOverride,
    DecisionSpec,
    FallbackRule,
    ModelRef,
    ModelVersion,
    Sla,
    TrainingData,
    VersionMetadata,
    effective_decision,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_METRICS_READER_SECRET",
    "DEFAULT_RUNTIME_IMAGE",
    "DEFAULT_STORAGE_SECRET",
    "EXTRA_VALIDATIONS",
    "GPU_PRODUCT_LABEL",
    "GROUP",
    "HOST_LABEL_SUFFIX",
    "ISVC_NAME_PATTERN",
    "KIND",
    "LABEL_VALUE_MAX",
    "MAX_ISVC_NAME",
    "MAX_ISVC_NAME_MULTINODE",
    "MAX_NAME_PLUS_VERSION",
    "MAX_NAME_PLUS_VERSION_MULTINODE",
    "MAX_SCHEMA_DEPTH",
    "NAME_PLUS_VERSION_BEFORE_NAMESPACE",
    "NAME_SEPARATOR",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AccessSpec",
    "Address",
    "Arg",
    "AuditRetention",
    "AuditS3",
    "AuditSpec",
    "AwsWebIdentity",
    "ContextRoute",
    "DecisionModel",
    "DecisionModelSpec",
    "DecisionModelStatus",
    "DecisionOverride",
    "DecisionSpec",
    "ExposureSpec",
    "FallbackRule",
    "JsonSchemaObject",
    "Label",
    "LocalRef",
    "LongStr",
    "MeshSpec",
    "ModelRef",
    "ModelVersion",
    "Name",
    "NetworkAccess",
    "NetworkPeer",
    "ObjectMeta",
    "ObjectRef",
    "RegistrySpec",
    "Resources",
    "RoutingSpec",
    "ServiceAccountRef",
    "ServingSpec",
    "ShortStr",
    "Sla",
    "StorageSpec",
    "Toleration",
    "TrainingData",
    "VersionMetadata",
    "VersionPhase",
    "VersionStatus",
    "VersionVllm",
    "VllmSettings",
    "effective_decision",
    "effective_vllm",
    "engine_memory_share",
    "isvc_name",
    "name_plus_version_limit",
    "schema_depth",
    "version_slug",
]

SINGULAR = "decisionmodel"
SHORT_NAMES = ["dm"]


# ---------------------------------------------------------------- spec


class DecisionModelSpec(_Model):
    model_config = _checked(
        _cel(
            "self.versions.exists(v, v.name == self.promote.version)",
            "spec.promote.version must name one of spec.versions[].name",
            ".promote.version",
        ),
        _cel(
            "!has(self.routing) || self.routing.contexts.all(c, self.versions.exists(v, v.name == c.version))",
            "spec.routing.contexts[].version must name one of spec.versions[].name",
            ".routing.contexts",
        ),
        _cel(
            "self.serving.nodes == 1 || self.serving.replicas == 1",
            "spec.serving.replicas must be 1 when spec.serving.nodes > 1 (a multi-node replica is one "
            "pipeline-parallel group)",
        ),
        _cel(
            "self.serving.nodes == 1 || self.versions.all(v, v.storageUri.startsWith('pvc://') || "
            "v.storageUri.startsWith('oci://'))",
            "spec.serving.nodes > 1 needs pvc:// or oci:// storageUris: KServe's multi-node predictor "
            "loads nothing else",
            ".serving.nodes",
        ),
    )

    model: ModelRef
    versions: list[ModelVersion] = Field(
        min_length=1,
        max_length=16,
        description="Versions that may serve; each gets its own InferenceService while it is live.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                _cel(
                    "self.all(v, self.exists_one(w, w.name.replace('.', '-') == v.name.replace('.', '-')))",
                    "spec.versions[].name must be unique (after '.' becomes '-': 1.0 and 1-0 collide)",
                )
            ],
        },
    )
    promote: PromoteSpec
    serving: ServingSpec = Field(default_factory=ServingSpec)
    exposure: ExposureSpec = Field(default_factory=ExposureSpec)
    mesh: MeshSpec = Field(default_factory=MeshSpec)
    decision: DecisionSpec
    registry: RegistrySpec | None = Field(None, description="Model Registry to record versions in.")
    storage: StorageSpec = Field(default_factory=StorageSpec)
    access: AccessSpec | None = Field(
        None, description="Who may call the model: the operator grants these callers `get` on every live version's "
        "InferenceService (what the runtime and OpenShift AI's authenticating proxy check), updated in the pass that "
        "creates or retires a version. Others the namespace's roles already allow may still call.")
    routing: RoutingSpec | None = Field(
        None, description="Contexts pinned to a version (a header and its value): decided by that version, which "
        "stays warm; the stable version's runtime forwards them with the caller's token.")
    audit: AuditSpec | None = Field(
        None, description="Where each decision's audit record is kept and for how long: stdout always; with s3, also "
        "that bucket, each object under S3 object lock for the retention asked (checked: the AuditReady condition).")


# Rules for classes defined in api/promotion.py (owned elsewhere): crdgen attaches them to the schema there.
EXTRA_VALIDATIONS: dict[type[BaseModel], list[JsonDict]] = {
    Analysis: [
        # has(): the apiserver also checks the rules against the schema's default object, where no field is set.
        _cel("!has(self.sequential) || (has(self.mode) && self.mode == 'Sequential')", SEQUENTIAL_NEEDS_MODE,
             ".sequential"),
        _cel("!has(self.mode) || self.mode != 'Sequential' || !has(self.failureLimit) || self.failureLimit == 0",
             SEQUENTIAL_FAILURE_LIMIT, ".failureLimit"),
    ],
    PromoteSpec: [
        _cel(
            "self.strategy != 'Canary' || size(self.steps) > 0",
            "spec.promote.strategy Canary needs at least one entry in spec.promote.steps",
        ),
        _cel(
            "[1, 2, 3, 4, 5, 6, 7, 8, 9].all(i, i >= size(self.steps) || "
            "self.steps[i - 1].weight < self.steps[i].weight)",
            "spec.promote.steps[].weight must be strictly increasing (e.g. 10, 50)",
        ),
    ],
}


# ---------------------------------------------------------------- status

VersionPhase = Literal["Pending", "Invalid", "Deploying", "Ready", "Failed", "Stopped"]


class VersionStatus(_Model):
    name: Annotated[str, StringConstraints(max_length=40)]
    phase: VersionPhase = "Pending"
    inferenceService: Annotated[str, StringConstraints(max_length=63)] | None = None
    ready: bool = False
    registeredModelId: ShortStr | None = None
    modelVersionId: ShortStr | None = None
    modelArtifactId: ShortStr | None = None
    artifactsDigest: ShortStr | None = None
    runtimeImage: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        None, description="The runtime image this version's InferenceService runs (pinned when it was deployed)."
    )
    tokensPerDecision: int | None = Field(
        None, ge=1, description="Scored mode: tokens the model generates per decision, counted with the version's "
        "own tokenizer (each is one forward pass; see the TokenCost condition).")
    message: LongStr | None = None


class Address(_Model):
    url: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        None, description="In-cluster URL of the DecisionModel's Service, which follows the stable version.")


class DecisionModelStatus(_Model):
    observedGeneration: int = Field(0, ge=0)
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    activeVersion: Annotated[str, StringConstraints(max_length=40)] | None = Field(
        None, description="Version that holds (most of) the traffic."
    )
    url: Annotated[str, StringConstraints(max_length=2048)] | None = Field(None, description="The Route's URL.")
    address: Address | None = Field(None, description="In-cluster address (as KServe's status.address).")
    versions: list[VersionStatus] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    promotion: PromotionStatus = Field(default_factory=PromotionStatus)


class ObjectMeta(BaseModel):
    """The part of metadata the operator reads; the apiserver owns the schema."""

    model_config = ConfigDict(extra="allow")
    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class DecisionModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    apiVersion: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: DecisionModelSpec
    status: DecisionModelStatus = Field(default_factory=DecisionModelStatus)
