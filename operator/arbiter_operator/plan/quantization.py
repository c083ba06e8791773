"""Quantization and GPU memory: can the GPU product a version is scheduled on run what it asks for? (pure)

Two kinds of check, each where its facts are:
- from the spec alone (`quantization_problems`, part of `plan.validate`: refused at `oc apply` by the webhook, else
  `InvalidSpec`): FP8 weights or an FP8 KV cache on a `gpuProduct` too old for them, FP8 with 32-bit activations;
- from the checkpoint on storage (`checkpoint_problem`, `memory_problem`, part of the artifact check, reported as
  `ArtifactsValid=False`): a checkpoint quantized before upload (its config.json `quantization_config`) whose method
  the GPU cannot run or that `quantization: fp8` contradicts, and weights plus one full-length sequence's KV cache
  that do not fit the GPU's memory at `gpuMemoryUtilization`.

The figures are vLLM 0.26's: FP8 weights (`--quantization fp8`, Fp8Config) need compute capability 7.5; from 8.9
(Ada, Hopper, Blackwell) they run as FP8 compute (W8A8, dynamic activation scales), from 7.5 to 8.6 (Turing, Ampere)
as weight-only FP8 through the Marlin kernels. An FP8 KV cache is stored by FlashAttention 3 on Hopper and by
FlashInfer from 8.0; below 8.0 only the Triton backend is left, whose FP8 (e4m3) type needs 8.9, so it is refused
there. Online FP8 quantizes the linear layers; the embeddings (and an untied output head) stay 16-bit.

Without `gpuProduct` (any GPU node) or with a product name of no known family (plan/gpus.py), nothing here is judged:
vLLM checks at start-up and the version's readiness reports what it said.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..api.models import DecisionModelSpec, ModelVersion, effective_vllm, engine_memory_share
from .gpus import GpuProduct, gpu_product

FP8_WEIGHTS_MIN = (7, 5)
FP8_COMPUTE_MIN = (8, 9)
FP8_KV_CACHE_MIN = (8, 0)
FP8_KV_CACHE = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
GIB = 1024 ** 3
# vLLM 0.26's least compute capability per checkpoint quantization method (its QuantizationConfig's
# get_min_capability, checked when the model loads), by the quant_method a config.json names.
CHECKPOINT_METHOD_MIN: dict[str, tuple[int, int]] = {
    "fp8": (7, 5), "awq": (7, 5), "awq_marlin": (7, 5), "auto_awq": (7, 5), "gptq": (6, 0), "gptq_marlin": (6, 0),
    "auto_gptq": (6, 0), "fbgemm_fp8": (8, 0), "fp_quant": (10, 0), "modelopt": (8, 9), "modelopt_fp4": (7, 5),
    "modelopt_mxfp8": (8, 0), "mxfp8": (8, 0), "compressed-tensors": (7, 0), "bitsandbytes": (7, 0),
    "experts_int8": (8, 0), "quark": (7, 0), "moe_wna16": (7, 0), "torchao": (7, 5), "mxfp4": (8, 0),
    "humming": (7, 5),
}
# Reasons of ArtifactsValid (plan/artifacts.py).
QUANTIZATION_UNSUPPORTED = "QuantizationUnsupported"
GPU_MEMORY_TOO_SMALL = "GPUMemoryTooSmall"
_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def _where(version: ModelVersion, field: str) -> str:
    """The field a user changes: the version's own when it sets one, else spec.serving.vllm's."""
    if version.vllm is not None and getattr(version.vllm, field) is not None:
        return f"spec.versions[{version.name}].vllm.{field}"
    return f"spec.serving.vllm.{field}"


def quantization_problems(spec: DecisionModelSpec) -> list[str]:
    """What the spec alone says cannot run: one message per problem, naming the field and what to write."""
    gpu = gpu_product(spec.serving.gpuProduct)
    problems: list[str] = []
    for version in spec.versions:
        v = effective_vllm(spec.serving.vllm, version.vllm)
        if v.quantization == "fp8" and _BYTES.get(v.dtype) == 4:
            problems.append(f"{_where(version, 'quantization')} fp8 runs with 16-bit activations, and "
                            f"spec.serving.vllm.dtype is {v.dtype}: set dtype auto, bfloat16 or float16")
        if gpu is None:
            continue
        if v.quantization == "fp8" and gpu.capability < FP8_WEIGHTS_MIN:
            problems.append(f"{_where(version, 'quantization')} fp8 cannot run on {gpu.label} (compute capability "
                            f"{gpu.capability_text}): vLLM's FP8 weights need {_cap(FP8_WEIGHTS_MIN)} or newer (FP8 "
                            f"compute from {_cap(FP8_COMPUTE_MIN)}: Ada, Hopper, Blackwell; weight-only through the "
                            "Marlin kernels on Turing and Ampere); set quantization auto, or spec.serving.gpuProduct "
                            "to a newer GPU")
        if v.kvCacheDtype in FP8_KV_CACHE and gpu.capability < FP8_KV_CACHE_MIN:
            problems.append(f"{_where(version, 'kvCacheDtype')} {v.kvCacheDtype} cannot run on {gpu.label} (compute "
                            f"capability {gpu.capability_text}): vLLM stores an FP8 KV cache with FlashAttention 3 or "
                            f"FlashInfer, from {_cap(FP8_KV_CACHE_MIN)} (Ampere) on; set kvCacheDtype auto, or "
                            "spec.serving.gpuProduct to a newer GPU")
    return list(dict.fromkeys(problems))


def fp8_mode(gpu: GpuProduct | None) -> str:
    """How vLLM runs FP8 weights on this GPU (for messages)."""
    if gpu is None:
        return "FP8"
    return "FP8 compute" if gpu.capability >= FP8_COMPUTE_MIN else "weight-only FP8 (Marlin)"


# ---------------------------------------------------------------- the checkpoint


def checkpoint_method(config: Mapping[str, Any], lang: Mapping[str, Any]) -> str | None:
    """The quant_method of a checkpoint quantized before upload (config.json quantization_config), or None."""
    for cfg in (config, lang):
        qc = cfg.get("quantization_config")
        if isinstance(qc, Mapping):
            method = qc.get("quant_method")
            return str(method) if method else "unnamed"
    return None


def checkpoint_problem(method: str | None, quantization: str, gpu: GpuProduct | None) -> str | None:
    """A pre-quantized checkpoint the settings or the GPU cannot serve, as a message; None when it can (or is not)."""
    if method is None:
        return None
    if quantization == "fp8" and method != "fp8":
        return (f"config.json says the checkpoint is already quantized ({method}), and vLLM refuses --quantization "
                "fp8 on a checkpoint of another method; set quantization auto (the checkpoint's own method is used), "
                "or upload the 16-bit checkpoint")
    least = CHECKPOINT_METHOD_MIN.get(method)
    if gpu is not None and least is not None and gpu.capability < least:
        return (f"config.json says the checkpoint is quantized with {method}, which vLLM runs from compute capability "
                f"{_cap(least)}, and {gpu.label} is {gpu.capability_text}; upload a 16-bit checkpoint, or set "
                "spec.serving.gpuProduct to a newer GPU")
    return None


# ---------------------------------------------------------------- memory


class MemoryAsk(Protocol):
    """The serving settings the memory check reads (plan.artifacts.ServingAsk has them)."""

    @property
    def tensor_parallel(self) -> int: ...
    @property
    def pipeline_parallel(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def quantization(self) -> str: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def gpu_memory_utilization(self) -> float: ...
    @property
    def gpu_product(self) -> str | None: ...
    @property
    def engines(self) -> int: ...


@dataclass(frozen=True)
class MemoryNeed:
    """What one GPU must hold at least: the weights and one maxModelLen sequence's KV cache (GiB); activations,
    CUDA graphs and the batch's KV cache come on top."""

    weights_gib: float
    kv_sequence_gib: float | None  # None: not counted (sliding-window, MLA or hybrid attention)
    weights_how: str

    @property
    def total_gib(self) -> float:
        return self.weights_gib + (self.kv_sequence_gib or 0.0)


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _checkpoint_bytes(config: Mapping[str, Any], lang: Mapping[str, Any]) -> int:
    for cfg in (lang, config):
        dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        if isinstance(dtype, str) and dtype in _BYTES:
            return _BYTES[dtype]
    return 2


def memory_need(config: Mapping[str, Any], lang: Mapping[str, Any], weights_bytes: int, v: MemoryAsk,
                method: str | None) -> MemoryNeed:
    """The least memory one GPU (of tensor x pipeline parallel) needs for these weights and settings."""
    served = 4 if _BYTES.get(v.dtype) == 4 else 2  # vLLM's auto serves a 32-bit checkpoint in 16 bits
    shards = v.tensor_parallel * v.pipeline_parallel
    if method is not None:
        weights, how = float(weights_bytes), f"as stored ({method})"
    else:
        weights = weights_bytes * served / _checkpoint_bytes(config, lang)
        how = f"{served * 8}-bit"
        if v.quantization == "fp8":
            # Online FP8 quantizes the linear layers; the embedding table (and an untied output head) stay 16-bit.
            vocab, hidden = _int(lang, "vocab_size") or _int(config, "vocab_size"), _int(lang, "hidden_size")
            tables = 1 if lang.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) else 2
            kept = min(weights, float(vocab * hidden * served * tables)) if vocab and hidden else 0.0
            weights, how = kept + (weights - kept) / served, "FP8, quantized at load"
    return MemoryNeed(weights / shards / GIB, _kv_sequence(lang, v, served), how)


def _kv_sequence(lang: Mapping[str, Any], v: MemoryAsk, served: int) -> float | None:
    """One maxModelLen sequence's KV cache on one GPU; None where the plain formula would overcount."""
    if any(lang.get(k) for k in ("sliding_window", "kv_lora_rank", "layer_types", "attention_chunk_size")):
        return None
    heads, layers, hidden = _int(lang, "num_attention_heads"), _int(lang, "num_hidden_layers"), _int(lang,
                                                                                                     "hidden_size")
    if not heads or not layers or not hidden:
        return None
    kv_heads = _int(lang, "num_key_value_heads") or heads
    head_dim = _int(lang, "head_dim") or hidden // heads
    # Tensor parallel splits the KV heads (each GPU keeps at least one); pipeline stages split the layers.
    per_gpu = layers / v.pipeline_parallel * max(1.0, kv_heads / v.tensor_parallel)
    elem = 1 if v.kv_cache_dtype in FP8_KV_CACHE else served
    return 2 * per_gpu * head_dim * elem * v.max_model_len / GIB


def memory_problem(need: MemoryNeed, gpu: GpuProduct, v: MemoryAsk, method: str | None) -> str | None:
    """A message when the weights and one full sequence cannot fit, with the changes that would make them fit."""
    budget = gpu.memory_gib * engine_memory_share(v.gpu_memory_utilization, v.engines)
    shards = v.tensor_parallel * v.pipeline_parallel
    if need.total_gib <= budget:
        return None
    kv = f" and {need.kv_sequence_gib:.1f} GiB for one maxModelLen sequence's KV cache" if need.kv_sequence_gib else ""
    fixes = []
    if v.quantization != "fp8" and method is None and gpu.capability >= FP8_WEIGHTS_MIN:
        fixes.append("quantization: fp8 (about half the weights)")
    if need.kv_sequence_gib and v.kv_cache_dtype not in FP8_KV_CACHE and gpu.capability >= FP8_KV_CACHE_MIN:
        fixes.append("kvCacheDtype: fp8 (half the KV cache)")
    if need.kv_sequence_gib and need.weights_gib < budget:
        fits = int((budget - need.weights_gib) / need.kv_sequence_gib * v.max_model_len)
        if fits >= 128:
            fixes.append(f"maxModelLen {fits} or less")
    fit = [e for e in range(v.engines - 1, 0, -1)
           if need.total_gib <= gpu.memory_gib * engine_memory_share(v.gpu_memory_utilization, e)]
    if fit:
        fixes.append(f"engines: {fit[0]} (each engine holds the weights in its share of the memory)")
    more = [g for g in (2, 4, 8) if g > shards and need.total_gib * shards / g <= budget and v.engines == 1]
    if more:
        fixes.append(f"gpus: {more[0]}")
    shared = f" shared by {v.engines} engines" if v.engines > 1 else ""
    return (f"the weights need {need.weights_gib:.1f} GiB per GPU ({need.weights_how}){kv}, more than the "
            f"{budget:.1f} GiB vLLM may use of {gpu.label}'s {gpu.memory_gib:.0f} GiB at gpuMemoryUtilization "
            f"{v.gpu_memory_utilization}{shared}; " + ("set " + ", or ".join(fixes) if fixes else "use a larger GPU"))


def quantization_fit(config: Mapping[str, Any], lang: Mapping[str, Any], size: int,
                     ask: MemoryAsk) -> tuple[str, str] | tuple[None, str]:
    """(reason, message) when the checkpoint's quantization or its memory does not fit the GPU product; else
    (None, the note the valid message carries)."""
    gpu = gpu_product(ask.gpu_product)
    method = checkpoint_method(config, lang)
    problem = checkpoint_problem(method, ask.quantization, gpu)
    if problem:
        return QUANTIZATION_UNSUPPORTED, problem
    need = memory_need(config, lang, size, ask, method)
    if gpu is None:
        why = "spec.serving.gpuProduct is unset" if not ask.gpu_product else f"{ask.gpu_product} is not known here"
        return None, (f"; weights {need.weights_gib:.1f} GiB per GPU ({need.weights_how}), GPU memory not checked "
                      f"({why})")
    problem = memory_problem(need, gpu, ask, method)
    if problem:
        return GPU_MEMORY_TOO_SMALL, problem
    mode = f", {fp8_mode(gpu)}" if ask.quantization == "fp8" or method == "fp8" else ""
    shared = f" shared by {ask.engines} engines" if ask.engines > 1 else ""
    return None, (f"; weights {need.weights_gib:.1f} GiB per GPU ({need.weights_how}{mode}) fit "
                  f"{gpu.label} at gpuMemoryUtilization {ask.gpu_memory_utilization}{shared}")
