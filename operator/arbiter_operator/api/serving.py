"""How a DecisionModel's versions are served and reached: spec.serving (pods, GPUs, vLLM), spec.exposure (the Route
and its auth) and spec.mesh (the service mesh's sidecar)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .fields import Arg, ShortStr, _cel, _checked, _Model, _rules
from .vllm_flags import MANAGED_VLLM_FLAGS, REMOVED_VLLM_FLAGS, UNSAFE_VLLM_FLAGS, flag_rule

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The operator's built-in runtime image (the one released with it); the Helm value runtime.image / the operator's
# --runtime-image flag replace it. Never a CRD default: apiserver defaulting would freeze it into every object.
DEFAULT_RUNTIME_IMAGE = "quay.io/arbiter-dev/arbiter-runtime:0.1.0"
# The Secret (in a DecisionModel's namespace, key `token`) whose bearer token Prometheus presents to the runtime's
# metrics when spec.exposure.auth is on (the PodMonitor's authorization); the operator's --metrics-reader-secret flag
# and the Helm value metrics.readerSecret replace the name.
DEFAULT_METRICS_READER_SECRET = "arbiter-metrics-reader"


# ---------------------------------------------------------------- spec.serving


class Toleration(_Model):
    key: ShortStr | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: ShortStr | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


# The weight quantizations and KV-cache dtypes vLLM 0.26 takes (`--quantization`, `--kv-cache-dtype`) that Arbiter
# checks against the GPU product and the weights' size before a version is deployed (plan/quantization.py).
Quantization = Literal["auto", "fp8"]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
QUANTIZATION_HELP = (
    "Weight quantization (--quantization). auto: the checkpoint as it is (16-bit weights stay 16-bit; a checkpoint "
    "quantized before upload, named by its config.json quantization_config, runs with its own method). fp8: FP8 "
    "weights, quantized when vLLM loads a 16-bit checkpoint (or an FP8 checkpoint as it is): FP8 compute on Ada, "
    "Hopper and Blackwell GPUs, weight-only FP8 through vLLM's Marlin kernels on Turing and Ampere (T4, A10, A100), "
    "refused on older GPUs. About half the weights' memory and time per token; decisions may change slightly."
)
KV_CACHE_DTYPE_HELP = (
    "KV cache dtype (--kv-cache-dtype). auto: the model's dtype. fp8 (= fp8_e4m3) or fp8_e5m2: half the KV cache "
    "memory, so more sequences fit; needs compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell)."
)


class VllmSettings(_Model):
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="Weights and activations dtype (--dtype)."
    )
    quantization: Quantization = Field("auto", description=QUANTIZATION_HELP + " A version may set its own "
                                       "(spec.versions[].vllm), which ships it canaried like any new version.")
    kvCacheDtype: KvCacheDtype = Field("auto", description=KV_CACHE_DTYPE_HELP)
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
    apiServers: int = Field(
        1, ge=1, le=16,
        description="vLLM API server processes in front of its engine (--api-server-count). Under load one process "
        "is the bound (a core each: chat template, log-probabilities, JSON); more raise decisions/s at high "
        "concurrency and cost a CPU core each under load. 1 renders no flag.",
    )
    engines: int = Field(
        1, ge=1, le=8,
        description="vLLM engines sharing each pod's GPU (gpus 1 and nodes 1 only), each with its own scheduler "
        "process and gpuMemoryUtilization / engines of the GPU's memory; the decision server sends each request to "
        "the engine with the fewest in flight. One engine's scheduler runs a core and bounds its decisions/s when "
        "the model is small for its GPU (a 7B FP8 model on an 80 GB GPU); a second engine uses the GPU time the "
        "first leaves. Each needs its own CPU (an engine core and its API servers) and memory for its weights. "
        "1 renders nothing.",
    )
    extraArgs: list[Arg] = Field(
        default_factory=list,
        max_length=64,
        description="More `vllm serve` arguments, passed as given after the rendered ones.",
        json_schema_extra={
            "x-kubernetes-validations": [flag_rule(f, m) for f, m in REMOVED_VLLM_FLAGS.items()]  # type: ignore[dict-item]
            + [flag_rule(f, m) for f, m in UNSAFE_VLLM_FLAGS.items()]
            + [
                flag_rule(f, f"{f} is set by the operator from {field}; set that field instead of extraArgs")
                for f, field in MANAGED_VLLM_FLAGS.items()
            ]
        },
    )


class VersionVllm(_Model):
    """The vLLM settings a version may set for itself: they change what the model computes, so a new value is
    shipped as a version and promoted (canaried or shadowed) against the one serving."""

    quantization: Quantization | None = Field(None, description="Overrides spec.serving.vllm.quantization for this "
                                              "version. " + QUANTIZATION_HELP)
    kvCacheDtype: KvCacheDtype | None = Field(None, description="Overrides spec.serving.vllm.kvCacheDtype for this "
                                              "version. " + KV_CACHE_DTYPE_HELP)


def effective_vllm(serving: VllmSettings, override: VersionVllm | None) -> VllmSettings:
    """spec.serving.vllm with a version's own settings applied (a field the version sets wins)."""
    if override is None:
        return serving
    return serving.model_copy(update=override.model_dump(exclude_none=True))


def engine_memory_share(utilization: float, engines: int) -> float:
    """Each engine's --gpu-memory-utilization: its share of the version's, rounded down (the engines' sum never
    above what the spec allows). One engine: the spec's value as written."""
    return utilization if engines == 1 else math.floor(utilization / engines * 1000) / 1000


class Resources(_Model):
    cpu: Annotated[str, StringConstraints(max_length=32)] = Field(
        "4", pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU request (and limit) per pod."
    )
    memory: Annotated[str, StringConstraints(max_length=32)] = Field(
        "32Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$", description="Memory request and limit per pod."
    )


class AwsWebIdentity(_Model):
    roleArn: Annotated[str, StringConstraints(max_length=2048)] = Field(
        pattern=r"^arn:[a-z0-9-]+:iam:[a-z0-9-]*:[0-9]*:role/[A-Za-z0-9+=,.@_/-]+$",
        description="The role the runtime assumes with its pod's ServiceAccount token (AWS_ROLE_ARN), e.g. "
        "arn:aws:iam::123456789012:role/fraud-audit-writer; its trust policy must admit "
        "system:serviceaccount:<namespace>:<spec.serving.serviceAccountName>.",
    )
    audience: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        "sts.amazonaws.com", description="The projected token's audience: the client id the identity provider expects."
    )
    stsEndpoint: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="STS to exchange the token at (AWS_ENDPOINT_URL_STS), e.g. an "
        "on-premises S3's STS; unset: AWS's STS for the region."
    )
    region: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, pattern=r"^[a-z0-9-]+$", description="AWS_REGION for the runtime (which regional STS answers)."
    )
    tokenExpirationSeconds: int = Field(
        3600, ge=600, le=86400, description="The projected token's lifetime; the kubelet renews it at 80%."
    )


class ServingSpec(_Model):
    model_config = _checked(
        _cel(
            "!has(self.vllm) || !has(self.vllm.engines) || self.vllm.engines == 1 || "
            "((!has(self.gpus) || self.gpus == 1) && (!has(self.nodes) || self.nodes == 1))",
            "spec.serving.vllm.engines above 1 shares one GPU between engines: it needs gpus 1 and nodes 1; for "
            "more GPUs per pod keep engines 1 (or serve more replicas)",
            ".vllm.engines",
        )
    )
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
    serviceAccountName: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The predictor pods' ServiceAccount (create it first), as which KServe's storage initializer and "
        "the runtime run: with the pod identity webhook of EKS or ROSA, its eks.amazonaws.com/role-arn annotation "
        "gives both a web identity for S3. Unset: the namespace's default ServiceAccount.",
    )
    awsWebIdentity: AwsWebIdentity | None = Field(
        None,
        description="A web identity the operator renders into the runtime container where no webhook injects one: a "
        "projected ServiceAccount token with this audience, AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, which the "
        "runtime's S3 audit reads through boto3's credential chain (docs/security.md, S3 credentials).",
    )


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
        "InferenceService (SubjectAccessReview) on every request but health probes; the metrics scrape needs get "
        "on the non-resource URL /metrics instead, and the PodMonitor presents the token of the operator's "
        "metrics-reader Secret in the namespace.",
    )


class MeshSpec(_Model):
    sidecar: Literal["auto", "exclude-inbound", "disable", "none"] = Field(
        "auto",
        description="auto: exclude the serving port when the namespace is mesh-injected; exclude-inbound: always "
        "exclude the serving port; disable: no sidecar; none: leave the mesh settings alone.",
    )
