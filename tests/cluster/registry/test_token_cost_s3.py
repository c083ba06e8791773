"""Generated tokens per decision, counted with each version's own tokenizer.json on a real S3 server (SeaweedFS).

The tokenizers are built by the test with the `tokenizers` library: the names given as words are one token each,
every other name is spelled from characters (several tokens), as an untouched base tokenizer splits a made-up code.
"""

from __future__ import annotations

import json
from datetime import UTC

import pytest
from arbiter_operator.api.conditions import TOKEN_COST
from arbiter_operator.observe.storage import check_version_artifacts
from arbiter_operator.plan.artifacts import ServingAsk, count_tokens, token_cost_condition
from arbiter_operator.plan.model import ArtifactObservation
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render.registry import KEY_TOKENS_PER_DECISION, desired_model
from hypothesis import given, settings
from hypothesis import strategies as st
from support.factory import make_dm
from test_artifacts_s3 import QWEN_LIKE, bucket, storage_for, upload  # noqa: F401  (bucket is a fixture)

s3_test = pytest.mark.asyncio(loop_scope="session")

LABELS = ["approved", "rejected", "review"]
CODES = ["INCOME_OK", "DEBT_RATIO_HIGH", "HISTORY_THIN"]


def tokenizer_json(words) -> bytes:
    """Characters as the base vocabulary; `words` added as whole tokens (how fine-tuning adds names)."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {"<eos>": 0, "<unk>": 1}
    for c in [chr(c) for c in range(32, 127)] + ["\n"]:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_tokens([AddedToken(w, normalized=False) for w in words])
    return tok.to_str().encode()


def scored(fmt="compact", steps=3):
    return {"labels": LABELS, "codes": CODES, "steps": steps, "scored_format": fmt}


async def check(s3_server, bucket, files, decision):  # noqa: F811
    uri = upload(s3_server, bucket, {"config.json": QWEN_LIKE, "model.safetensors": b"w", **files})
    async with storage_for(s3_server, bucket) as storage:
        return await check_version_artifacts(storage, uri, ServingAsk(), decision)


@s3_test
async def test_single_token_names_cost_two_tokens_per_step(s3_server, bucket):  # noqa: F811
    files = {"tokenizer.json": tokenizer_json(LABELS + CODES)}
    compact = await check(s3_server, bucket, files, scored())
    lines = await check(s3_server, bucket, files, scored("lines"))
    assert compact.status == "True" and compact.tokens_per_decision == 6  # 3 steps x (code + label), no end
    assert lines.tokens_per_decision == 13  # 3 steps x (code + ':' + label + newline) + end
    cond = token_cost_condition({"1.0.0": compact}, 4, now=utc_now())
    assert (cond.type, cond.status, cond.reason) == (TOKEN_COST, "True", "SingleTokens")
    assert "1.0.0: 6" in cond.message and cond.observedGeneration == 4


@s3_test
async def test_a_split_label_or_code_gets_a_warning_with_its_cost_and_what_to_do(s3_server, bucket):  # noqa: F811
    # "review" and "HISTORY_THIN" are not in the vocabulary: spelled from characters.
    files = {"tokenizer.json": tokenizer_json(["approved", "rejected", "INCOME_OK", "DEBT_RATIO_HIGH"])}
    report = await check(s3_server, bucket, files, scored())
    assert report.status == "True", "a warning never holds the version back"
    assert report.tokens_per_decision == 3 * (len("HISTORY_THIN") + len("review")) + 1
    cond = token_cost_condition({"2.0.0": report}, 1, now=utc_now())
    assert (cond.status, cond.reason) == ("False", "MultiTokenNames")
    assert "label 'review' is 6 tokens" in cond.message and "reasoning code 'HISTORY_THIN' is 12 tokens" in cond.message
    assert f"up to {report.tokens_per_decision} tokens instead of 6" in cond.message
    assert "refuses this model in scored mode" in cond.message and "tokenizer.add_tokens" in cond.message


@s3_test
async def test_the_fused_format_costs_one_token_per_step_only_with_every_pair_one_token(s3_server, bucket):  # noqa: F811
    pairs = [c + x for c in CODES for x in LABELS]
    fused = await check(s3_server, bucket, {"tokenizer.json": tokenizer_json(pairs)}, scored("fused"))
    assert fused.status == "True" and fused.tokens_per_decision == 3  # one pair token per step, no end
    assert token_cost_condition({"1.0.0": fused}, 2, now=utc_now()).reason == "SingleTokens"
    # The names alone are single tokens, the pairs are not: the runtime would refuse the model, and says so here.
    split = await check(s3_server, bucket, {"tokenizer.json": tokenizer_json(LABELS + CODES)}, scored("fused"))
    assert split.tokens_per_decision == 3 * 2 + 1
    cond = token_cost_condition({"2.0.0": split}, 2, now=utc_now())
    assert (cond.status, cond.reason) == ("False", "MultiTokenNames")
    assert "pair 'INCOME_OKapproved' is 2 tokens" in cond.message
    assert "scoredFormat fused each step is one pair token, so the runtime refuses this model" in cond.message


@s3_test
async def test_no_tokenizer_or_an_unreadable_one_is_reported_not_guessed(s3_server, bucket):  # noqa: F811
    missing = await check(s3_server, bucket, {}, scored())
    broken = await check(s3_server, bucket, {"tokenizer.json": b'{"model": 3}'}, scored())
    assert missing.status == broken.status == "True" and missing.tokens_per_decision is None
    cond = token_cost_condition({"1.0.0": missing}, 1, now=utc_now())
    assert (cond.status, cond.reason) == ("Unknown", "TokenizerMissing") and "no tokenizer.json" in cond.message
    assert "cannot be read" in token_cost_condition({"1.0.0": broken}, 1, now=utc_now()).message


@s3_test
async def test_generated_mode_is_not_counted(s3_server, bucket):  # noqa: F811
    report = await check(s3_server, bucket, {"tokenizer.json": tokenizer_json(LABELS)}, None)
    assert report.tokens_per_decision is None and token_cost_condition({"1.0.0": report}, 1, now=utc_now()) is None


def test_the_count_reaches_status_and_the_registry():
    from datetime import datetime

    from arbiter_operator.api.models import DecisionModelStatus
    from arbiter_operator.plan.model import Observations
    from arbiter_operator.plan.planner import plan

    dm = make_dm(model="credit", versions=["1.0.0"])
    obs = Observations(artifacts={"1.0.0": ArtifactObservation(valid=True, digest="sha256:x", tokens_per_decision=7)})
    status = plan(dm, obs, datetime.now(UTC)).status
    assert [v.get("tokensPerDecision") for v in status["versions"]] == [7]
    dm.status = DecisionModelStatus.model_validate(status)
    version = desired_model(dm).versions[0]
    assert version.properties[KEY_TOKENS_PER_DECISION] == 7


@settings(max_examples=150, deadline=None)
@given(raw=st.one_of(st.binary(max_size=200),
                     st.recursive(st.none() | st.integers() | st.text(max_size=8),
                                  lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                      st.sampled_from(["model", "type", "vocab", "merges", "added_tokens",
                                                       "pre_tokenizer", "normalizer", "x"]), c, max_size=4),
                                  max_leaves=10).map(lambda v: json.dumps(v).encode())))
def test_a_hostile_tokenizer_json_is_reported_never_raised(raw):
    fields = count_tokens(raw, scored(), "s3://models/m/1")
    assert "cannot be read" in fields["token_cost"] or fields["tokens_per_decision"] >= 6
