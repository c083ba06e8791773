"""FP8 weights and KV cache: what the operator renders, and what it refuses before a GPU is spent."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from arbiter_operator import admission
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.clients.s3 import ObjectInfo
from arbiter_operator.plan import ArtifactObservation, Observations, children_of, plan
from arbiter_operator.plan.artifacts import ServingAsk, check_artifacts, serving_ask
from arbiter_operator.plan.gpus import gpu_product
from arbiter_operator.plan.quantization import memory_need
from arbiter_operator.render.inferenceservice import vllm_args
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import example
from test_planner import T0, _cond, _converge, _ready, _with_status

GIB = 1024 ** 3
# A Gemma-7B-shaped checkpoint (the GPU benchmark's): 8.5 B parameters in bf16, tied embeddings.
GEMMA_7B = {"architectures": ["GemmaForCausalLM"], "hidden_size": 3072, "intermediate_size": 24576,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
            "vocab_size": 256000, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
            "tie_word_embeddings": True}
WEIGHTS_7B = 17_075_000_000  # bytes of its safetensors shards


def dm_with(serving: dict[str, Any] | None = None, vllm: dict[str, Any] | None = None,
            versions: dict[str, dict[str, Any] | None] | None = None, promote: dict[str, Any] | None = None,
            generation: int = 1) -> DecisionModel:
    raw = copy.deepcopy(example())
    raw["metadata"].update(namespace="team-a", uid="u1", generation=generation)
    spec = raw["spec"]
    spec["serving"].update(serving or {})
    spec["serving"]["vllm"].update(vllm or {})
    if versions is not None:
        template = spec["versions"][0]
        spec["versions"] = []
        for name, own in versions.items():
            entry = copy.deepcopy(template) | {"name": name}
            if own is not None:
                entry["vllm"] = own
            spec["versions"].append(entry)
    if promote is not None:
        spec["promote"] = promote
    return DecisionModel.model_validate(raw)


def review_problems(dm: DecisionModel) -> list[str]:
    """What the admission webhook answers at `oc apply` ([]: admitted)."""
    return admission.problems(dm.model_dump(mode="json", by_alias=True, exclude_none=True))


def isvc_args(p, version: str) -> list[str]:
    name = "credit-limit--" + version.replace(".", "-")
    isvc = next(c for c in p.children if c["kind"] == "InferenceService" and c["metadata"]["name"] == name)
    return isvc["spec"]["predictor"]["model"]["args"]


# ---------------------------------------------------------------- rendered arguments


def test_fp8_renders_vllm_026s_flags_and_a_default_model_renders_none():
    plain = vllm_args(dm_with())
    assert not any(a.startswith(("--quantization", "--kv-cache-dtype")) for a in plain)
    fp8 = vllm_args(dm_with(vllm={"quantization": "fp8", "kvCacheDtype": "fp8_e4m3"}))
    assert fp8 == [*plain[:5], "--quantization=fp8", "--kv-cache-dtype=fp8_e4m3", *plain[5:]]
    assert plain[4] == "--dtype=auto"


def test_a_versions_own_setting_wins_and_reaches_only_its_inferenceservice():
    versions = {"1.0.0": None, "1.0.0-fp8": {"quantization": "fp8", "kvCacheDtype": "fp8"}}
    gpu = {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}
    dm = dm_with(serving=gpu, versions=versions, promote={"version": "1.0.0", "strategy": "Immediate"})
    assert vllm_args(dm, dm.spec.versions[0]) == vllm_args(dm_with(serving=gpu))
    assert "--quantization=fp8" in vllm_args(dm, dm.spec.versions[1])
    # 1.0.0 (bf16) serves; the FP8 version is then promoted as a canary and comes up beside it with its own args.
    first = plan(dm, Observations(), T0)
    ready = {c["metadata"]["name"]: _ready(c) for c in first.children if c["kind"] == "InferenceService"}
    dm, _ = _converge(_with_status(dm, first.status), lambda _: Observations(children=children_of(
        InferenceService=ready)))
    canary = dm_with(serving=gpu, versions=versions, generation=2, promote={
        "version": "1.0.0-fp8", "strategy": "Canary", "steps": [{"weight": 10, "holdSeconds": 300}]})
    p = plan(_with_status(canary, dm.status.model_dump(mode="json", by_alias=True, exclude_none=True)),
             Observations(children=children_of(InferenceService=ready)), T0)
    assert {"--quantization=fp8", "--kv-cache-dtype=fp8"} <= set(isvc_args(p, "1.0.0-fp8"))
    assert not any(a.startswith("--quantization") for a in isvc_args(p, "1.0.0"))
    assert p.status["promotion"]["stable"] == "1.0.0" and p.status["promotion"]["candidate"] == "1.0.0-fp8"


# ---------------------------------------------------------------- refused from the spec


@pytest.mark.parametrize("product,vllm,refused", [
    ("Tesla-V100-SXM2-16GB", {"quantization": "fp8"}, "FP8 weights need 7.5 or newer"),
    ("Tesla-T4", {"quantization": "fp8"}, None),  # weight-only FP8 through Marlin
    ("Tesla-T4", {"kvCacheDtype": "fp8"}, "kvCacheDtype fp8 cannot run on Tesla-T4 (compute capability 7.5)"),
    ("NVIDIA-A100-SXM4-80GB", {"quantization": "fp8", "kvCacheDtype": "fp8_e5m2"}, None),
    ("NVIDIA-H200", {"quantization": "fp8", "kvCacheDtype": "fp8"}, None),
    ("Some-Future-GPU", {"quantization": "fp8", "kvCacheDtype": "fp8"}, None),  # not known: vLLM judges
    (None, {"quantization": "fp8", "dtype": "float32"}, "fp8 runs with 16-bit activations"),
])
def test_a_quantization_the_gpu_cannot_run_is_refused_at_apply_and_in_status(product, vllm, refused):
    dm = dm_with(serving={"gpuProduct": product}, vllm=vllm)
    problems = review_problems(dm)
    p = plan(dm, Observations(), T0)
    if refused is None:
        assert problems == [] and any(c["kind"] == "InferenceService" for c in p.children)
        return
    assert len(problems) == 1 and refused in problems[0] and "spec.serving.vllm." in problems[0]
    assert p.children is None  # nothing created, nothing that serves changed
    assert _cond(p, "Ready")["reason"] == "InvalidSpec" and refused in _cond(p, "Ready")["message"]


def test_the_refusal_names_the_versions_own_field():
    dm = dm_with(serving={"gpuProduct": "Tesla-V100-PCIE-32GB"}, versions={"1.0.0": None, "2.0.0": {
        "quantization": "fp8"}}, promote={"version": "1.0.0", "strategy": "Immediate"})
    (problem,) = review_problems(dm)
    assert problem.startswith("spec.versions[2.0.0].vllm.quantization fp8 cannot run on Tesla-V100-PCIE-32GB")


# ---------------------------------------------------------------- refused from the checkpoint


def files(weights: int = WEIGHTS_7B, shards: int = 4) -> tuple[list[ObjectInfo], dict[str, Any]]:
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    listing = [ObjectInfo(key="config.json", size=600, etag="c")] + [
        ObjectInfo(key=n, size=weights // shards, etag=n) for n in names]
    listing.append(ObjectInfo(key="model.safetensors.index.json", size=9, etag="i"))
    return listing, {"weight_map": {f"layer.{i}": n for i, n in enumerate(names)}}


def check(config=GEMMA_7B, weights: int = WEIGHTS_7B, **ask):
    listing, index = files(weights)
    return check_artifacts(config, listing, ServingAsk(max_model_len=2048, **ask), where="s3://m/7b", index=index)


def test_bf16_7b_does_not_fit_a_t4_and_the_message_says_what_would():
    report = check(gpu_product="Tesla-T4")
    assert (report.status, report.reason) == ("False", "GPUMemoryTooSmall")
    assert "15.9 GiB per GPU (16-bit)" in report.message and "set quantization: fp8" in report.message
    fp8 = check(gpu_product="Tesla-T4", quantization="fp8")
    assert fp8.status == "True", fp8.message
    assert "weight-only FP8 (Marlin)" in fp8.message and "fit Tesla-T4" in fp8.message


def test_fp8_halves_the_linear_layers_and_keeps_the_embeddings():
    ask = serving_ask(dm_with(vllm={"quantization": "fp8"}).spec)
    bf16 = memory_need(GEMMA_7B, GEMMA_7B, WEIGHTS_7B, ServingAsk(), None).weights_gib
    fp8 = memory_need(GEMMA_7B, GEMMA_7B, WEIGHTS_7B, ask, None).weights_gib
    embeddings = 256000 * 3072 * 2 / GIB
    assert fp8 == pytest.approx(embeddings + (bf16 - embeddings) / 2)


def test_without_a_gpu_product_memory_is_not_claimed_checked():
    report = check()
    assert report.status == "True" and "GPU memory not checked (spec.serving.gpuProduct is unset)" in report.message


@pytest.mark.parametrize("quant_cfg,ask,reason,says", [
    ({"quant_method": "awq"}, {"quantization": "fp8"}, "QuantizationUnsupported", "already quantized (awq)"),
    ({"quant_method": "modelopt"}, {"gpu_product": "NVIDIA-A100-SXM4-40GB"}, "QuantizationUnsupported",
     "modelopt, which vLLM runs from compute capability 8.9"),
    ({"quant_method": "fp8"}, {"quantization": "fp8", "gpu_product": "NVIDIA-L4"}, None, "FP8 compute"),
    ({"quant_method": "compressed-tensors"}, {"gpu_product": "NVIDIA-A10"}, None, "as stored (compressed-tensors)"),
])
def test_a_prequantized_checkpoint_is_read_from_its_config(quant_cfg, ask, reason, says):
    report = check(dict(GEMMA_7B, quantization_config=quant_cfg), weights=WEIGHTS_7B // 2, **ask)
    assert report.reason == (reason or "ArtifactsValid"), report.message
    assert says in report.message


def test_a_refused_checkpoint_deploys_nothing_for_that_version():
    dm = dm_with(vllm={"quantization": "fp8"})
    obs = Observations(artifacts={"1.0.0": ArtifactObservation(
        valid=False, reason="QuantizationUnsupported", message="already quantized (awq)")})
    p = plan(dm, obs, T0)
    assert not any(c["kind"] == "InferenceService" for c in p.children)


# ---------------------------------------------------------------- hostile names and sizes


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=128))
def test_any_product_name_is_read_without_error(label):
    gpu = gpu_product(label)
    assert gpu is None or (gpu.memory_gib > 0 and gpu.capability >= (3, 0))


@pytest.mark.parametrize("label,family,capability,memory", [
    ("NVIDIA-H100-80GB-HBM3", "H100", (9, 0), 80), ("NVIDIA-H200", "H200", (9, 0), 141),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100", (8, 0), 5), ("NVIDIA-L4", "L4", (8, 9), 24),
    ("NVIDIA-L40S", "L40S", (8, 9), 48), ("Tesla-T4", "T4", (7, 5), 15), ("NVIDIA-GH200-480GB", "GH200", (9, 0), 96),
    ("NVIDIA-RTX-6000-Ada-Generation", "RTX-6000-Ada", (8, 9), 48), ("NVIDIA-A10G", "A10G", (8, 6), 24),
])
def test_gpu_feature_discovery_names(label, family, capability, memory):
    gpu = gpu_product(label)
    assert gpu is not None and (gpu.family, gpu.capability, gpu.memory_gib) == (family, capability, memory)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=10 ** 6, max_value=10 ** 12), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from(["auto", "fp8"]), st.sampled_from(["auto", "fp8"]))
def test_fp8_never_needs_more_memory_and_more_gpus_never_more_per_gpu(size, tp, quant, kv):
    base = ServingAsk(tensor_parallel=tp)
    asked = ServingAsk(tensor_parallel=tp, quantization=quant, kv_cache_dtype=kv)
    plain = memory_need(GEMMA_7B, GEMMA_7B, size, base, None)
    need = memory_need(GEMMA_7B, GEMMA_7B, size, asked, None)
    assert need.total_gib <= plain.total_gib + 1e-9
    wider = memory_need(GEMMA_7B, GEMMA_7B, size, ServingAsk(tensor_parallel=tp * 2, quantization=quant), None)
    assert wider.weights_gib <= need.weights_gib


def test_each_engine_must_hold_the_weights_in_its_share_and_the_message_says_how_many_fit():
    """FP8 7B on an L4 (24 GB): two engines at 0.9 fit (0.45 each), three do not, and the refusal says engines: 2."""
    two = check(gpu_product="NVIDIA-L4", quantization="fp8", engines=2)
    assert two.status == "True" and "at gpuMemoryUtilization 0.9 shared by 2 engines" in two.message, two.message
    three = check(gpu_product="NVIDIA-L4", quantization="fp8", engines=3)
    assert (three.status, three.reason) == ("False", "GPUMemoryTooSmall")
    assert "at gpuMemoryUtilization 0.9 shared by 3 engines" in three.message
    assert "engines: 2 (each engine holds the weights in its share of the memory)" in three.message
    assert "gpus:" not in three.message  # more GPUs per pod is no fix: engines need gpus 1
