"""artifacts.py without servers: the checks a user meets before any GPU is spent."""

from __future__ import annotations

import pytest
from arbiter_operator.clients.s3 import ObjectInfo
from arbiter_operator.plan.artifacts import (
    ArtifactReport,
    ServingAsk,
    artifacts_condition,
    check_artifacts,
    derived_max_len,
    listing_digest,
    not_checkable,
    parse_storage_uri,
)
from arbiter_operator.reconcile import utc_now

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 8192,
}


def files(*names: str, size: int = 10) -> list[ObjectInfo]:
    return [ObjectInfo(key=n, size=size, etag=f"etag-{n}") for n in ("config.json", *names)]


def run(config=LLAMA_8B, listing=None, index=None, **ask):
    return check_artifacts(config, files("model.safetensors") if listing is None else listing,
                           ServingAsk(**ask), where="s3://models/m/1", index=index)


def test_a_fitting_model_is_valid():
    report = run(tensor_parallel=8, max_model_len=8192, architecture="LlamaForCausalLM")
    assert (report.status, report.reason) == ("True", "ArtifactsValid")
    assert "LlamaForCausalLM fits tensor parallel 8, maxModelLen 8192" in report.message


@pytest.mark.parametrize(
    "heads,kv,tp,message",
    [
        (32, 32, 3, "tensor parallel 3 does not divide 32 attention heads; use 1, 2, 4 or 8"),
        (12, 4, 8, "tensor parallel 8 does not divide 12 attention heads; use 1, 2 or 4"),
        (40, 8, 8, None),
        (32, 6, 4, "tensor parallel 4 does not fit 6 key/value heads (neither divides the other); use 1 or 2"),
    ],
)
def test_tensor_parallel_against_heads(heads, kv, tp, message):
    report = run(dict(LLAMA_8B, num_attention_heads=heads, num_key_value_heads=kv), tensor_parallel=tp)
    if message is None:  # 40 heads / 8 KV heads split evenly over 8 GPUs
        assert report.status == "True", report.message
        return
    assert (report.status, report.reason) == ("False", "TensorParallelMismatch")
    assert report.message == message + " (spec.serving.gpus)"


def test_fewer_kv_heads_than_gpus_are_replicated_not_rejected():
    # Qwen-style GQA: 2 KV heads on 8 GPUs is fine for vLLM (each KV head is copied to 4 GPUs).
    report = run(dict(LLAMA_8B, num_attention_heads=16, num_key_value_heads=2), tensor_parallel=8)
    assert report.status == "True", report.message


def test_kv_heads_default_to_attention_heads():
    config = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert run(config, tensor_parallel=8).status == "True"


def test_max_model_len_too_large_names_both_numbers_and_the_fix():
    report = run(max_model_len=16384)
    assert (report.status, report.reason) == ("False", "MaxModelLenTooLarge")
    assert report.message == (
        "maxModelLen 16384 is larger than the 8192 tokens the model supports (max_position_embeddings); "
        "set spec.serving.vllm.maxModelLen to 8192 or less"
    )


def test_nested_text_config_holds_the_numbers():
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "vision_config": {"num_attention_heads": 16},
        "text_config": {"num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072},
    }
    assert run(config, tensor_parallel=8, max_model_len=131072).status == "True"
    report = run(config, tensor_parallel=1, max_model_len=262144)
    assert report.reason == "MaxModelLenTooLarge" and "131072" in report.message


def test_rope_scaling_extends_the_limit_like_vllm():
    yarn = dict(LLAMA_8B, max_position_embeddings=131072,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert derived_max_len(yarn)[0] == 131072
    linear = dict(LLAMA_8B, rope_scaling={"type": "linear", "factor": 2.0})
    assert derived_max_len(linear)[0] == 16384
    llama3 = dict(LLAMA_8B, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert derived_max_len(llama3)[0] == 8192  # already included in max_position_embeddings


def test_pipeline_stages_beyond_layers_fail():
    report = run(dict(LLAMA_8B, num_hidden_layers=4), pipeline_parallel=8)
    assert report.reason == "PipelineParallelMismatch" and "4 layers" in report.message


def test_architecture_must_match_the_spec():
    report = run(architecture="Qwen3ForCausalLM")
    assert report.reason == "ArchitectureMismatch"
    assert "LlamaForCausalLM" in report.message and "Qwen3ForCausalLM" in report.message


def test_config_missing_or_unusable():
    missing = check_artifacts(None, [ObjectInfo("model.safetensors", 1, "e")], ServingAsk(), where="s3://b/p")
    assert (missing.status, missing.reason) == ("False", "ConfigMissing")
    assert "s3://b/p" in missing.message
    broken = check_artifacts(None, files(), ServingAsk(), where="s3://b/p", config_error="Expecting value")
    assert broken.reason == "ConfigInvalid"
    no_heads = run({"architectures": ["X"], "max_position_embeddings": 10})
    assert no_heads.reason == "ConfigInvalid"


def test_weights():
    index = {"weight_map": {"a": "model-00001-of-00003.safetensors", "b": "model-00002-of-00003.safetensors",
                            "c": "model-00003-of-00003.safetensors"}}
    complete = files("model.safetensors.index.json", *sorted(set(index["weight_map"].values())))
    assert run(listing=complete, index=index).status == "True"

    missing = run(listing=files("model.safetensors.index.json", "model-00001-of-00003.safetensors"), index=index)
    assert missing.reason == "WeightsMissing"
    assert "2 of 3 weight shards" in missing.message
    assert "model-00002-of-00003.safetensors, model-00003-of-00003.safetensors" in missing.message

    assert run(listing=files("README.md")).reason == "WeightsMissing"
    assert "index" in run(listing=files("a.safetensors", "b.safetensors")).message
    empty = run(listing=files("model.safetensors", size=0))
    assert empty.reason == "WeightsMissing" and "0 bytes" in empty.message
    # Weights in a subfolder are not where vLLM looks.
    assert run(listing=files("sub/model.safetensors")).reason == "WeightsMissing"


def test_gguf_weights():
    assert run(listing=files("model-Q4_K_M.gguf"), weights_format="gguf").status == "True"
    assert run(listing=files("model.safetensors"), weights_format="gguf").reason == "WeightsMissing"


def test_diffusion_models_are_detected_and_said_so():
    by_arch = run(dict(LLAMA_8B, architectures=["DiffusionGemmaForBlockDiffusion"]))
    by_canvas = run(dict(LLAMA_8B, canvas_length=256))
    for report in (by_arch, by_canvas):
        assert report.status == "True" and report.diffusion
        assert "no structured outputs and no seed" in report.message
    plain = run()
    assert not plain.diffusion and "diffusion" not in plain.message


def test_listing_digest_is_order_free_and_sees_every_change():
    a = [ObjectInfo("config.json", 10, "e1"), ObjectInfo("model.safetensors", 99, "e2")]
    assert listing_digest(a) == listing_digest(list(reversed(a)))
    assert listing_digest(a) != listing_digest([a[0], ObjectInfo("model.safetensors", 99, "e3")])
    assert listing_digest(a) != listing_digest([a[0], ObjectInfo("model.safetensors", 98, "e2")])
    assert listing_digest(a) != listing_digest(a[:1])


def test_storage_uri_parsing():
    assert parse_storage_uri("s3://models/credit/1.0.0/") == ("s3", "models", "credit/1.0.0")
    assert parse_storage_uri("s3://models") == ("s3", "models", "")
    assert parse_storage_uri("pvc://claim/path")[0] == "pvc"


def test_pvc_and_oci_are_valid_but_not_checkable():
    for uri in ("pvc://claim/models/1", "oci://quay.io/acme/model:1"):
        report = not_checkable(uri)
        assert (report.status, report.reason) == ("True", "NotCheckable")
        assert uri in report.message and "vLLM checks it at start-up" in report.message


def test_condition_folds_versions_false_before_unknown_before_true():
    ok = ArtifactReport("True", "ArtifactsValid", "fine")
    down = ArtifactReport("Unknown", "StorageUnreachable", "cannot reach S3")
    bad = ArtifactReport("False", "WeightsMissing", "no weights")
    cond = artifacts_condition({"1.0.0": ok, "2.0.0": down, "3.0.0": bad}, generation=4, now=utc_now())
    assert (cond.type, cond.status, cond.reason) == ("ArtifactsValid", "False", "WeightsMissing")
    assert cond.message == "version 3.0.0: no weights"
    cond = artifacts_condition({"1.0.0": ok, "2.0.0": down}, generation=4, now=utc_now())
    assert (cond.status, cond.reason) == ("Unknown", "StorageUnreachable")
    cond = artifacts_condition({"1.0.0": ok, "2.0.0": not_checkable("pvc://c/p")}, generation=4, now=utc_now())
    assert (cond.status, cond.reason) == ("True", "ArtifactsValid")
    assert "2.0.0 on pvc/oci" in cond.message
    cond = artifacts_condition({"2.0.0": not_checkable("pvc://c/p")}, generation=4, now=utc_now())
    assert (cond.status, cond.reason) == ("True", "NotCheckable")
