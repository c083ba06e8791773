"""Artifact checks against a real S3 server (SeaweedFS): model directories the tests upload, then
check_version_artifacts.

Each case is a small model directory (config.json + weight files of a few bytes) in its own prefix; credentials go
through KServe's storage-config form, as the operator reads them from the Secret.
"""

from __future__ import annotations

import json
import uuid

import pytest
from arbiter_devenv.registryserver import free_port
from arbiter_operator.clients import s3
from arbiter_operator.clients.s3 import S3Storage, credentials_from_secret
from arbiter_operator.observe.storage import check_decision_model, check_version_artifacts
from arbiter_operator.plan.artifacts import ServingAsk, artifacts_condition
from arbiter_operator.reconcile import utc_now
from support.factory import make_dm

pytestmark = pytest.mark.asyncio(loop_scope="session")

QWEN_LIKE = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 36,
    "max_position_embeddings": 40960,
}


@pytest.fixture(scope="session")
def bucket(s3_server) -> str:
    name = f"models-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def storage_config(s3_server, bucket: str, **overrides) -> dict[str, str]:
    """The Secret's data (decoded) as KServe's storage-config has it: one JSON entry per key."""
    entry = {
        "type": "s3",
        "access_key_id": s3_server.access_key,
        "secret_access_key": s3_server.secret_key,
        "endpoint_url": s3_server.endpoint_url,
        "region": s3_server.region,
        "verify_ssl": "0",
        "bucket": bucket,
        **overrides,
    }
    return {bucket: json.dumps(entry)}


def storage_for(s3_server, bucket: str, **overrides) -> S3Storage:
    creds = credentials_from_secret(storage_config(s3_server, bucket, **overrides), secret_name="storage-config",
                                    bucket=bucket)
    return S3Storage(creds, connect_timeout=2, read_timeout=5)


def upload(s3_server, bucket: str, files: dict[str, bytes | dict]) -> str:
    prefix = f"m-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()
    for key, body in files.items():
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)
    return f"s3://{bucket}/{prefix}"


DEFAULT_ASK = ServingAsk()


async def check(s3_server, bucket, files, ask=DEFAULT_ASK, **overrides):
    uri = upload(s3_server, bucket, files)
    async with storage_for(s3_server, bucket, **overrides) as storage:
        return await check_version_artifacts(storage, uri, ask)


async def test_a_complete_model_passes_and_gets_a_digest(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE, "model.safetensors": b"weights"},
                         ServingAsk(tensor_parallel=4, max_model_len=32768, architecture="Qwen3ForCausalLM"))
    assert report.status == "True", report.message
    assert report.digest.startswith("sha256:")
    assert not report.diffusion


async def test_sharded_model_with_all_shards_passes(s3_server, bucket):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    report = await check(s3_server, bucket, {
        "config.json": QWEN_LIKE, "model.safetensors.index.json": index,
        "model-00001-of-00002.safetensors": b"1", "model-00002-of-00002.safetensors": b"2",
    })
    assert report.status == "True", report.message


async def test_tensor_parallel_that_does_not_divide_heads_fails_with_what_works(s3_server, bucket):
    config = dict(QWEN_LIKE, num_attention_heads=12, num_key_value_heads=4)
    report = await check(s3_server, bucket, {"config.json": config, "model.safetensors": b"w"},
                         ServingAsk(tensor_parallel=8))
    assert (report.status, report.reason) == ("False", "TensorParallelMismatch")
    assert report.message == (
        "tensor parallel 8 does not divide 12 attention heads; use 1, 2 or 4 (spec.serving.gpus)"
    )


async def test_max_model_len_beyond_the_model_fails(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE, "model.safetensors": b"w"},
                         ServingAsk(max_model_len=65536))
    assert (report.status, report.reason) == ("False", "MaxModelLenTooLarge")
    assert "65536" in report.message and "40960" in report.message


async def test_nested_text_config_is_what_counts(s3_server, bucket):
    config = {"architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": {"num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 8192}}
    ok = await check(s3_server, bucket, {"config.json": config, "model.safetensors": b"w"},
                     ServingAsk(tensor_parallel=4, max_model_len=8192))
    bad = await check(s3_server, bucket, {"config.json": config, "model.safetensors": b"w"},
                      ServingAsk(tensor_parallel=1, max_model_len=16384))
    assert ok.status == "True", ok.message
    assert (bad.status, bad.reason) == ("False", "MaxModelLenTooLarge")
    assert "8192" in bad.message


async def test_missing_shard_fails_naming_it(s3_server, bucket):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    report = await check(s3_server, bucket, {
        "config.json": QWEN_LIKE, "model.safetensors.index.json": index, "model-00001-of-00002.safetensors": b"1",
    })
    assert (report.status, report.reason) == ("False", "WeightsMissing")
    assert "model-00002-of-00002.safetensors" in report.message


async def test_no_weights_at_all_fails(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE, "README.md": b"hi"})
    assert (report.status, report.reason) == ("False", "WeightsMissing")


async def test_missing_config_fails(s3_server, bucket):
    report = await check(s3_server, bucket, {"model.safetensors": b"w"})
    assert (report.status, report.reason) == ("False", "ConfigMissing")
    assert "config.json" in report.message


async def test_broken_config_fails(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": b"{not json", "model.safetensors": b"w"})
    assert (report.status, report.reason) == ("False", "ConfigInvalid")


async def test_diffusion_model_is_detected_and_tells_the_runtime(s3_server, bucket):
    config = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "num_attention_heads": 8,
              "num_key_value_heads": 4, "max_position_embeddings": 8192, "canvas_length": 256}
    report = await check(s3_server, bucket, {"config.json": config, "model.safetensors": b"w"})
    assert report.status == "True", report.message
    assert report.diffusion and "no structured outputs and no seed" in report.message


async def test_digest_changes_when_a_file_is_rewritten(s3_server, bucket):
    uri = upload(s3_server, bucket, {"config.json": QWEN_LIKE, "model.safetensors": b"v1"})
    async with storage_for(s3_server, bucket) as storage:
        before = await check_version_artifacts(storage, uri, ServingAsk())
        again = await check_version_artifacts(storage, uri, ServingAsk())
        s3_server.client().put_object(Bucket=bucket, Key=uri.split("/", 3)[3] + "/model.safetensors", Body=b"v2")
        after = await check_version_artifacts(storage, uri, ServingAsk())
    assert before.digest == again.digest != after.digest


async def test_s3_down_is_unknown_and_retried(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE},
                         endpoint_url=f"http://127.0.0.1:{free_port()}")
    assert (report.status, report.reason) == ("Unknown", "StorageUnreachable")


async def test_wrong_credentials_are_unknown_and_rechecked_without_showing_them(s3_server, bucket):
    # Credentials are fixed outside the DecisionModel: Unknown (checked again), not False (a sticky failed promotion).
    secret = "not-the-secret-" + uuid.uuid4().hex
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE}, secret_access_key=secret)
    assert (report.status, report.reason) == ("Unknown", "StorageAccessDenied")
    assert "checked again" in report.message
    assert secret not in report.message and s3_server.secret_key not in report.message


async def test_decision_model_with_one_bad_version_gets_artifacts_valid_false(s3_server, bucket):
    good = upload(s3_server, bucket, {"config.json": QWEN_LIKE, "model.safetensors": b"w"})
    bad = upload(s3_server, bucket, {"config.json": dict(QWEN_LIKE, num_attention_heads=6, num_key_value_heads=6),
                                     "model.safetensors": b"w"})
    dm = make_dm(model="credit", versions={"1.0.0": good, "2.0.0": bad, "3.0.0": "pvc://claim/models/3"}, gpus=4)
    async with storage_for(s3_server, bucket) as storage:
        reports = await check_decision_model(storage, dm)
    assert [reports[v].status for v in ("1.0.0", "2.0.0", "3.0.0")] == ["True", "False", "True"]
    assert reports["3.0.0"].reason == "NotCheckable"
    cond = artifacts_condition(reports, generation=7, now=utc_now())
    assert (cond.status, cond.reason, cond.observedGeneration) == ("False", "TensorParallelMismatch", 7)
    assert cond.message.startswith("version 2.0.0: tensor parallel 4 does not divide 6 attention heads; use 1 or 2")


async def test_anonymous_access_reads_a_public_bucket_and_is_refused_by_a_private_one(s3_server, bucket):
    public = f"public-{uuid.uuid4().hex[:8]}"
    admin = s3_server.client()
    admin.create_bucket(Bucket=public)
    admin.put_bucket_policy(Bucket=public, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{public}", f"arn:aws:s3:::{public}/*"]}]}))
    files = {"config.json": QWEN_LIKE, "model.safetensors": b"w"}
    anonymous = {"anonymous": "1", "access_key_id": "", "secret_access_key": ""}
    ok = await check(s3_server, public, files, **anonymous)
    denied = await check(s3_server, bucket, files, **anonymous)
    assert ok.status == "True", ok.message
    assert (denied.status, denied.reason) == ("Unknown", "StorageAccessDenied")
    assert "AccessDenied" in denied.message


async def test_odd_keys_and_continuation_tokens_are_signed_as_s3_expects(s3_server, bucket, monkeypatch):
    # Small pages so the listing needs continuation tokens (their characters must be encoded as signed).
    monkeypatch.setattr(s3, "PAGE_KEYS", 2)
    prefix = f"odd {uuid.uuid4().hex[:6]}/ü+ä=&?"
    names = ["config.json", "model.safetensors", "a b.txt", "x+y", "percent%2F.bin"]
    for name in names:
        s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=name.encode())
    async with storage_for(s3_server, bucket) as storage:
        listed = await storage.list_objects(bucket, prefix)
        bodies = [await storage.get_bytes(bucket, f"{prefix}/{name}") for name in names]
    assert sorted(o.key for o in listed) == sorted(names)
    assert bodies == [name.encode() for name in names]


async def test_a_bad_endpoint_is_reported_without_its_password(s3_server, bucket):
    report = await check(s3_server, bucket, {"config.json": QWEN_LIKE},
                         endpoint_url="http://user:hunter2@127.0.0.1:[bad")
    assert report.status == "Unknown" and "hunter2" not in report.message
