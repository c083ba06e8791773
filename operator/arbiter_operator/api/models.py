"""The DecisionModel API (`arbiter.dev/v1alpha1`): the single source of truth.

Field names are the JSON names (camelCase). `api/crdgen.py` turns these classes into the CRD's OpenAPI schema;
cross-field rules live here as CEL (`x-kubernetes-validations`) next to the fields they guard, so the apiserver
rejects bad input with a message that says what to write instead. What only the operator can judge (CEL syntax of
fallback rules, artifacts on storage) is reported through `Stalled` instead.

Every list and string carries a bound: the apiserver estimates the cost of CEL rules from them and refuses a CRD whose
rules could run unbounded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import JsonDict  # type: ignore[attr-defined]  # pydantic defines it, exports none

from .conditions import Condition
from .names import API_VERSION as API_VERSION  # these `X as X`: re-exported, the API's identity
from .names import GROUP as GROUP
from .names import KIND as KIND
from .names import PLURAL as PLURAL
from .names import VERSION as VERSION
from .promotion import PromoteSpec, PromotionStatus
from .vllm_flags import MANAGED_VLLM_FLAGS, REMOVED_VLLM_FLAGS, flag_rule

SINGULAR = "decisionmodel"
SHORT_NAMES = ["dm"]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The operator's built-in runtime image (the one released with it); the Helm value runtime.image / the operator's
# --runtime-image flag replace it. Never a CRD default: apiserver defaulting would freeze it into every object.
DEFAULT_RUNTIME_IMAGE = "quay.io/arbiter-dev/arbiter-runtime:0.1.0"
# KServe's own name for the Secret its storage initializer reads (one key per storage profile).
DEFAULT_STORAGE_SECRET = "storage-config"

# Child names (api/naming below; docs/architecture.md "Child names" has the proof that they never coincide):
# the InferenceService is `<name>--<version slug>`, and KServe v0.17 derives from it the predictor Deployment and
# Service `<isvc>-predictor` and the pod label `app: isvc.<isvc>-predictor`; a label value is at most 63 characters,
# so the InferenceService name is at most 63 - len("isvc.") - len("-predictor") = 48 characters, i.e. name plus
# version at most 48 - len("--") = 46. Multi-node predictors add `-worker` (label `isvc.<isvc>-predictor-worker`):
# 41 and 39.
NAME_SEPARATOR = "--"
LABEL_VALUE_MAX = 63
MAX_ISVC_NAME = LABEL_VALUE_MAX - len("isvc.") - len("-predictor")
MAX_ISVC_NAME_MULTINODE = MAX_ISVC_NAME - len("-worker")
MAX_NAME_PLUS_VERSION = MAX_ISVC_NAME - len(NAME_SEPARATOR)
MAX_NAME_PLUS_VERSION_MULTINODE = MAX_ISVC_NAME_MULTINODE - len(NAME_SEPARATOR)
# KServe's RawDeployment host label for a predictor, `<isvc>-predictor-<namespace>`, is one DNS label too, and KServe
# refuses the InferenceService when it is longer: name plus version at most 63 - len("--") - len("-predictor-") = 50
# characters less the namespace's length. The CRD cannot see the namespace; the operator (plan/validate.py) and the
# chart's admission policy (its CEL holds the same 50, tested against this) refuse it.
HOST_LABEL_SUFFIX = "-predictor-"
NAME_PLUS_VERSION_BEFORE_NAMESPACE = LABEL_VALUE_MAX - len(NAME_SEPARATOR) - len(HOST_LABEL_SUFFIX)


def name_plus_version_limit(namespace: str) -> int:
    """How long a DecisionModel's name plus a version's name may be in `namespace` (never more than the CRD's)."""
    return min(MAX_NAME_PLUS_VERSION, NAME_PLUS_VERSION_BEFORE_NAMESPACE - len(namespace))

# KServe's InferenceService name rule (IsvcNameFmt in its validating webhook); the DecisionModel's name starts every
# InferenceService name, so it must fit the same rule (no dots, a letter first).
ISVC_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"

Name = Annotated[str, StringConstraints(min_length=1, max_length=63)]
ShortStr = Annotated[str, StringConstraints(max_length=256)]
LongStr = Annotated[str, StringConstraints(max_length=4096)]
Arg = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# How deep an inputSchema or outputSchema may nest (objects and arrays, the schema itself counting as one). A JSON
# Schema of a real request or trajectory nests a few levels (each property adds two: `properties`, then the property's
# schema); the apiserver admits 10,000, deeper than the operator's JSON libraries go (orjson writes 255 levels, reads
# 1,024). The CRD cannot refuse it (CEL has no recursion, and may not read a member of a preserve-unknown-fields
# object at all: the apiserver refuses such a rule), so the operator does, as InvalidSpec (docs/user-guide.md "Limits").
MAX_SCHEMA_DEPTH = 64


def schema_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """How deep `value` nests (a scalar: 0, `{}`: 1), counted iteratively (no recursion on hostile input) and only up
    to `limit` + 1: beyond that the answer is "too deep"."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _not_too_deep(schema: dict[str, Any]) -> dict[str, Any]:
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"nested deeper than {MAX_SCHEMA_DEPTH} levels, the most the operator accepts: a JSON Schema "
                         "that deep describes no real document")
    return schema


JsonSchemaObject = Annotated[dict[str, Any], AfterValidator(_not_too_deep)]

def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _rules(*rules: JsonDict) -> JsonDict:
    """A field's CEL rules (the schema's x-kubernetes-validations), for its json_schema_extra."""
    return {"x-kubernetes-validations": list(rules)}


def _checked(*rules: JsonDict) -> ConfigDict:
    """The config of an object whose schema carries CEL rules across its fields."""
    return ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=_rules(*rules))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- spec.model


class ModelRef(_Model):
    name: Name = Field(description="The model's name in the Model Registry (RegisteredModel name).")
    description: LongStr | None = Field(None, description="Shown in the registry next to the model.")
    architecture: ShortStr | None = Field(
        None,
        description="Expected architecture from config.json (e.g. Qwen3ForCausalLM); checked against the artifacts.",
    )
    format: Literal["safetensors", "gguf"] = Field(
        "safetensors", description="Weights format, recorded on the registry's ModelArtifact."
    )


# ---------------------------------------------------------------- spec.decision


class FallbackRule(_Model):
    name: Label = Field(description="Rule name, reported in audit records when the rule decides.")
    when: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="CEL expression over `input` (the request) and `model` (the model's result, absent when the "
        "model failed); the first rule that is true decides."
    )
    decision: Label = Field(description="The label this rule decides; must be one of decision.labels.")
    reasoningCode: Label = Field(
        description="Reasoning code reported with the decision; one of decision.reasoningCodes."
    )


class DecisionSpec(_Model):
    model_config = _checked(
        _cel(
            "self.lowConfidencePolicy != 'fallback' || size(self.fallbackRules) > 0",
            "decision.lowConfidencePolicy 'fallback' needs at least one entry in decision.fallbackRules",
        ),
        _cel(
            "self.fallbackRules.all(r, r.decision in self.labels)",
            "every decision.fallbackRules[].decision must be one of decision.labels",
        ),
        _cel(
            "self.fallbackRules.all(r, r.reasoningCode in self.reasoningCodes)",
            "every decision.fallbackRules[].reasoningCode must be one of decision.reasoningCodes",
        ),
    )

    labels: list[Label] = Field(
        min_length=2,
        max_length=32,
        description="The decisions the model chooses between, e.g. [approved, rejected, review].",
        json_schema_extra=_rules(
            _cel("self.all(l, self.exists_one(m, m == l))", "decision.labels must be unique")
        ),
    )
    reasoningCodes: list[Label] = Field(
        min_length=1,
        max_length=256,
        description="Reasoning codes the model cites in each trajectory step (it may cite no other).",
        json_schema_extra=_rules(
            _cel("self.all(l, self.exists_one(m, m == l))", "decision.reasoningCodes must be unique")
        ),
    )
    steps: int = Field(1, ge=1, le=16, description="Number of steps in the decision trajectory.")
    trajectoryMode: Literal["scored", "generated"] = Field(
        "scored",
        description="scored: label probabilities read from the model's logprobs per step; generated: the model "
        "writes the trajectory as JSON constrained by the output schema.",
    )
    scoredFormat: Literal["compact", "lines"] = Field(
        "compact",
        description="What the model writes in scored mode. compact: per step the reasoning code immediately "
        "followed by the label, no separators (2 generated tokens per step with single-token names; codes and "
        "labels must each be prefix-free); lines: one line CODE:LABEL per step (4 tokens per step), for models "
        "fine-tuned on that format.",
    )
    confidenceThreshold: float = Field(
        0.7, ge=0, le=1, description="A final decision below this confidence is low-confidence."
    )
    lowConfidencePolicy: Literal["flag", "fallback"] = Field(
        "flag", description="flag: return the decision marked lowConfidence; fallback: let the fallback rules decide."
    )
    deadlineMs: int = Field(
        1000, ge=10, le=600000, description="Per-request deadline; past it the fallback rules decide."
    )
    fallbackRules: list[FallbackRule] = Field(
        default_factory=list,
        max_length=64,
        description="Rules-engine fallback used when the model is down, late or unsure (per lowConfidencePolicy).",
        json_schema_extra=_rules(
            _cel("self.all(r, self.exists_one(s, s.name == r.name))", "decision.fallbackRules names must be unique")
        ),
    )


class DecisionOverride(_Model):
    """Per-version override of spec.decision: any field set here wins for that version."""

    labels: list[Label] | None = Field(None, min_length=2, max_length=32)
    reasoningCodes: list[Label] | None = Field(None, min_length=1, max_length=256)
    steps: int | None = Field(None, ge=1, le=16)
    trajectoryMode: Literal["scored", "generated"] | None = None
    scoredFormat: Literal["compact", "lines"] | None = None
    confidenceThreshold: float | None = Field(None, ge=0, le=1)
    lowConfidencePolicy: Literal["flag", "fallback"] | None = None
    deadlineMs: int | None = Field(None, ge=10, le=600000)
    fallbackRules: list[FallbackRule] | None = Field(None, max_length=64)


# ---------------------------------------------------------------- spec.versions[]


class Sla(_Model):
    p95LatencyMs: int = Field(ge=1, le=600000, description="p95 decision latency the version promises (ms).")
    # The decision-quality bounds the version promises: the promotion analysis uses them when spec.promote.analysis
    # sets none.
    maxFallbackRate: float | None = Field(
        None, ge=0, le=1, description="Highest share of decisions the fallback rules may make (0..1)."
    )
    maxSchemaViolationRate: float | None = Field(
        None, ge=0, description="Highest number of rejected model answers per decision."
    )
    maxLowConfidenceRate: float | None = Field(
        None, ge=0, le=1, description="Highest share of decisions under the confidence threshold (0..1)."
    )


class TrainingData(_Model):
    model_config = _checked(
        _cel("self.to >= self.from", "trainingData.to must not be before trainingData.from")
    )
    from_: Annotated[str, StringConstraints(max_length=10)] = Field(
        alias="from",
        pattern=r"^\d{4}-\d{2}-\d{2}$",
        description="First day of the training data (YYYY-MM-DD).",
    )
    to: Annotated[str, StringConstraints(max_length=10)] = Field(
        pattern=r"^\d{4}-\d{2}-\d{2}$", description="Last day of the training data (YYYY-MM-DD)."
    )


class VersionMetadata(_Model):
    """Governance metadata, recorded in the Model Registry and enforced by the runtime."""

    inputSchema: JsonSchemaObject = Field(
        description="JSON Schema every request is validated against (nested at most 64 levels deep).")
    outputSchema: JsonSchemaObject = Field(
        description="JSON Schema every trajectory must also pass: the document {\"steps\": [{step, reasoningCode, "
        "label, probabilities, confidence}, ...]}. The operator refuses one that no trajectory of the version's "
        "decision settings can satisfy, and one nested more than 64 levels deep."
    )
    sla: Sla
    trainingData: TrainingData
    biasReportUrl: Annotated[str, StringConstraints(max_length=2048)] = Field(
        pattern=r"^https?://", description="Where the version's bias report lives (http or https URL)."
    )


class ModelVersion(_Model):
    name: Annotated[str, StringConstraints(min_length=1, max_length=40)] = Field(
        pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$",
        description="Version string (lowercase, digits, '.', '-'), e.g. 1.4.0; dots become '-' in child names.",
    )
    storageUri: Annotated[str, StringConstraints(min_length=7, max_length=2048)] = Field(
        description="Where the weights are: s3://bucket/prefix, pvc://claim/path or oci://registry/image:tag.",
        json_schema_extra=_rules(
            _cel(
                "self.matches('^(s3|pvc|oci)://[^/]+')",
                "storageUri must start with s3://, pvc:// or oci:// followed by a bucket, claim or registry",
            )
        ),
    )
    metadata: VersionMetadata
    decision: DecisionOverride | None = Field(None, description="Overrides of spec.decision for this version.")


# ---------------------------------------------------------------- spec.serving


class Toleration(_Model):
    key: ShortStr | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: ShortStr | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class VllmSettings(_Model):
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="Weights and activations dtype (--dtype)."
    )
    maxModelLen: int = Field(
        4096, ge=128, le=1048576, description="Context length (--max-model-len); checked against the model's config."
    )
    maxNumSeqs: int = Field(64, ge=1, le=4096, description="Concurrent sequences per engine (--max-num-seqs).")
    blockSize: Literal[8, 16, 32, 64, 128] = Field(16, description="KV cache block size in tokens (--block-size).")
    enforceEager: bool = Field(False, description="Disable CUDA graphs (--enforce-eager): slower, faster start-up.")
    gpuMemoryUtilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory vLLM may use (--gpu-memory-utilization)."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Sampling seed (--seed): same input, same decision.")
    structuredOutputsBackend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = Field(
        "auto", description="Constrained-decoding backend (--structured-outputs-config.backend)."
    )
    extraArgs: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description="More `vllm serve` arguments, passed as given after the rendered ones.",
        json_schema_extra={
            "x-kubernetes-validations": [flag_rule(f, m) for f, m in REMOVED_VLLM_FLAGS.items()]  # type: ignore[dict-item]
            + [
                flag_rule(f, f"{f} is set by the operator from {field}; set that field instead of extraArgs")
                for f, field in MANAGED_VLLM_FLAGS.items()
            ]
        },
    )


class Resources(_Model):
    cpu: Annotated[str, StringConstraints(max_length=32)] = Field(
        "4", pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU request (and limit) per pod."
    )
    memory: Annotated[str, StringConstraints(max_length=32)] = Field(
        "32Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$", description="Memory request and limit per pod."
    )


class ServingSpec(_Model):
    runtimeImage: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        None,
        description="Arbiter runtime image (decision server + vLLM) for every live version of this model. Unset: "
        "the operator's setting (Helm value runtime.image), pinned per version when the version is deployed, so a "
        "new default reaches a model with its next promotion, canaried like any other.",
    )
    gpus: int = Field(
        1,
        description="GPUs per pod, which is also the tensor parallel size: 1, 2, 4 or 8.",
        json_schema_extra=_rules(
            _cel(
                "self in [1, 2, 4, 8]",
                "spec.serving.gpus is the tensor parallel size and must be 1, 2, 4 or 8",
            )
        ),
    )
    nodes: int = Field(
        1, ge=1, le=16, description="Pods per replica; more than 1 splits layers across nodes (pipeline parallel)."
    )
    replicas: int = Field(1, ge=1, le=64, description="Replicas of each version's predictor.")
    gpuProduct: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        None,
        description=f"GPU product to schedule on, matched on the {GPU_PRODUCT_LABEL} node label (GPU feature "
        "discovery), e.g. NVIDIA-H100-80GB-HBM3. Unset or empty: any node with a free nvidia.com/gpu.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        max_length=32,
        description="Tolerations for tainted GPU nodes.",
    )
    resources: Resources = Field(default_factory=Resources)
    vllm: VllmSettings = Field(default_factory=VllmSettings)


# ---------------------------------------------------------------- spec.exposure / mesh


class ExposureSpec(_Model):
    model_config = _checked(
        _cel(
            "!(self.auth && has(self.tls) && self.tls == 'edge')",
            "exposure.tls edge with auth on cannot be reached: edge sends plain HTTP to the predictor, and OpenShift "
            "AI's KServe serves an authenticated predictor only through its authenticating proxy (Service port "
            "https, TLS), removing the runtime's port 8080 from the predictor Service; leave tls unset (reencrypt "
            "to the proxy) or set auth: false",
            ".tls",
        )
    )
    host: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None,
        pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$",
        description="Route host; empty lets the router pick <name>-<namespace>.<apps domain>.",
    )
    tls: Literal["edge", "reencrypt"] | None = Field(
        None,
        description="TLS termination at the router. Unset: reencrypt to the predictor's `https` port (OpenShift AI's "
        "authenticating proxy, service-CA certificate) when auth is on, edge to the runtime's port when it is off.",
    )
    timeout: Annotated[str, StringConstraints(max_length=16)] = Field(
        "60s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Router timeout (haproxy.router.openshift.io/timeout)."
    )
    auth: bool = Field(
        True,
        description="Require a bearer token the cluster accepts (TokenReview) whose user may get the version's "
        "InferenceService (SubjectAccessReview) on every request but health probes and metrics.",
    )


class MeshSpec(_Model):
    sidecar: Literal["auto", "exclude-inbound", "disable", "none"] = Field(
        "auto",
        description="auto: exclude the serving port when the namespace is mesh-injected; exclude-inbound: always "
        "exclude the serving port; disable: no sidecar; none: leave the mesh settings alone.",
    )


# ---------------------------------------------------------------- spec.registry / storage


class ObjectRef(_Model):
    name: Name
    namespace: Name | None = Field(None, description="Defaults to the DecisionModel's namespace.")


class LocalRef(_Model):
    name: Name
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = None


class RegistrySpec(_Model):
    model_config = _checked(
        _cel(
            "has(self.modelRegistryRef) != has(self.url)",
            "spec.registry needs exactly one of modelRegistryRef or url",
        )
    )
    modelRegistryRef: ObjectRef | None = Field(
        None, description="A ModelRegistry (modelregistry.opendatahub.io); its status gives the REST address."
    )
    url: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="Registry REST base URL, when not found through a ModelRegistry."
    )
    tokenSecretRef: LocalRef | None = Field(
        None, description="Secret with the bearer token (key `token` by default); default: the operator's own token."
    )
    caBundleConfigMapRef: LocalRef | None = Field(
        None, description="ConfigMap with the CA bundle (key `ca.crt` by default) for the registry's TLS."
    )


class StorageSpec(_Model):
    secretName: Name = Field(
        DEFAULT_STORAGE_SECRET, description="Secret in KServe's storage-config form (one JSON entry per key)."
    )
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        None, description="Entry in the Secret; default: the entry named after the bucket, then `default`."
    )
    endpoint: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="S3 endpoint override (e.g. MinIO)."
    )
    region: Annotated[str, StringConstraints(max_length=64)] | None = None
    caBundleConfigMapRef: LocalRef | None = Field(None, description="ConfigMap with the CA bundle for the endpoint.")


# ---------------------------------------------------------------- spec


class DecisionModelSpec(_Model):
    model_config = _checked(
        _cel(
            "self.versions.exists(v, v.name == self.promote.version)",
            "spec.promote.version must name one of spec.versions[].name",
            ".promote.version",
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


# Rules for classes defined in api/promotion.py (owned elsewhere): crdgen attaches them to the schema there.
EXTRA_VALIDATIONS: dict[type[BaseModel], list[JsonDict]] = {
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


def version_slug(version: str) -> str:
    """Version name as it appears in child names (a DNS label has no dots)."""
    return version.replace(".", "-")


def isvc_name(dm_name: str, version: str) -> str:
    """`<dm>--<slug>`. Injective on (dm, slug) because a DecisionModel name never contains `--` and never ends with
    `-` (the CRD refuses both): the first `--` of an InferenceService name is the separator."""
    return f"{dm_name}{NAME_SEPARATOR}{version_slug(version)}"


def effective_decision(spec: DecisionSpec, version: ModelVersion) -> DecisionSpec:
    """spec.decision with the version's overrides applied (a field set on the version wins)."""
    if version.decision is None:
        return spec
    override = version.decision.model_dump(exclude_none=True)
    return spec.model_copy(update=override)
