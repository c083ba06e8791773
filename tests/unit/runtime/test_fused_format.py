"""The fused scored format: one token per step, for a model whose tokenizer has each (code, label) pair as one token.

Against the stand-in upstream, which decodes token by token under the regex the runtime sends: a fused decision costs
exactly K generated tokens and reads each label's probability from the pair tokens of the code written. A tokenizer
without the pair tokens is refused before the server is ready; a hostile upstream never gets a half-read, cut or
inconsistent trajectory through.
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from arbiter_devenv.vllm_standin import StandinServer, build_tokenizer, write_model_dir
from arbiter_runtime.config import ConfigError, parse_config
from arbiter_runtime.contract import MAX_LOGPROB_TOKEN_IDS
from arbiter_runtime.decide import ScoredMode
from arbiter_runtime.tokens import LabelTokens, TokenizerJsonSource, TokenizerRefused, resolve_pairs
from arbiter_runtime.trajectory import TrajectoryChecker, TrajectoryInvalid
from hypothesis import given, settings
from hypothesis import strategies as st
from support.polling import eventually
from support.runtime_helpers import CODES, LABELS, base_config

CASE = {"amount": 1200, "country": "DE"}
PAIRS = [c + x for c in CODES for x in LABELS]


@pytest.fixture
def pair_standin():
    """A model fine-tuned with every (code, label) pair added to its tokenizer as one token."""
    server = StandinServer(words=tuple(PAIRS), served_model_name="credit-v1", added_tokens=True).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_fused_decision_costs_one_token_per_step_and_reads_each_label_given_its_code(pair_standin, make_runtime):
    steps = 4
    server = make_runtime(base_config(pair_standin.url, scoredFormat="fused", steps=steps))
    with server.client() as c:
        answer = c.post("/v1/decisions", json=CASE).json()
    assert answer["source"] == "model", answer
    trajectory = answer["trajectory"]["steps"]
    assert [s["step"] for s in trajectory] == [1, 2, 3, 4]
    assert all(math.isclose(sum(s["probabilities"].values()), 1.0, abs_tol=1e-9) for s in trajectory)
    body = pair_standin.state.requests[-1]
    vocab = pair_standin.state.text_to_id
    # Every pair's token is asked for, and generation ends on the last step's token: K tokens, no end of sequence.
    assert body["max_tokens"] == steps and sorted(body["logprob_token_ids"]) == sorted(vocab[p] for p in PAIRS)
    r = httpx.post(pair_standin.url + "/chat/completions", json=body, timeout=10).json()
    assert r["usage"]["completion_tokens"] == steps and r["choices"][0]["finish_reason"] == "length"
    content = r["choices"][0]["message"]["content"]
    assert content == "".join(s["reasoningCode"] + s["label"] for s in trajectory)
    # Each step's probabilities are the pair tokens of the code written, normalised over the labels.
    for s, entry in zip(trajectory, r["choices"][0]["logprobs"]["content"], strict=True):
        lp = {alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]}
        weights = {x: math.exp(lp[s["reasoningCode"] + x]) for x in LABELS}
        assert s["probabilities"] == pytest.approx({x: w / sum(weights.values()) for x, w in weights.items()})


def test_a_tokenizer_without_the_pair_tokens_is_refused_before_ready_with_what_to_do(make_runtime):
    upstream = StandinServer(words=(*LABELS, *CODES), served_model_name="credit-v1", added_tokens=True).start()
    try:
        server = make_runtime(base_config(upstream.url, scoredFormat="fused"), wait_ready=False)
        with server.client() as c:
            def refused():
                r = c.get("/v2/health/ready")
                return r if "scoredFormat fused" in r.text else None

            r = eventually(refused, timeout=10, what="the refusal on /v2/health/ready", interval=0.05)
        assert r.status_code == 503
        error = r.json()["error"]
        assert "'income_okapprove' is 2 tokens" in error and "tokenizer.add_tokens" in error
        assert "scoredFormat: compact" in error
    finally:
        upstream.stop()


def test_more_pairs_than_vllm_returns_are_refused_with_the_count():
    codes = [*CODES, *(f"c{i}x" for i in range(MAX_LOGPROB_TOKEN_IDS // 3 + 1 - len(CODES)))]  # x 3 labels: 129
    with pytest.raises(ConfigError, match=r"= 129 pair tokens .* at most 128"):
        parse_config(base_config("http://127.0.0.1:1/v1", scoredFormat="fused", reasoningCodes=codes))
    parse_config(base_config("http://127.0.0.1:1/v1", scoredFormat="fused", reasoningCodes=codes[:-1]))


def test_pair_ids_come_from_the_model_directory_s_tokenizer(tmp_path):
    """The same resolution from tokenizer.json (`--model-dir`) as from /tokenize: one distinct id per pair."""
    model = write_model_dir(tmp_path / "fused", tuple(PAIRS), added=True)
    tokens = asyncio.run(resolve_pairs(TokenizerJsonSource(model), tuple(LABELS), tuple(CODES)))
    vocab = build_tokenizer(tuple(PAIRS), added=True).get_vocab()
    assert tokens.single_token_steps and tokens.pair_ids == {(c, x): vocab[c + x] for c in CODES for x in LABELS}
    plain = write_model_dir(tmp_path / "plain", (*LABELS, *CODES), added=True)
    with pytest.raises(TokenizerRefused, match="'income_okapprove' is 2 tokens"):
        asyncio.run(resolve_pairs(TokenizerJsonSource(plain), tuple(LABELS), tuple(CODES)))


# ---------------------------------------------------------------- a hostile upstream, in the fused format

FUSED = parse_config(base_config("http://127.0.0.1:1/v1", steps=3, scoredFormat="fused"))
PAIR_IDS = {(c, x): 100 + i for i, (c, x) in enumerate((c, x) for c in CODES for x in LABELS)}
MODE = ScoredMode(FUSED, LabelTokens(label_ids={}, code_ids={}, source="test", single_token_steps=True,
                                     pair_ids=PAIR_IDS))
CHECKER = TrajectoryChecker(FUSED)
logprob = st.one_of(st.floats(min_value=-30, max_value=0), st.just(-9999.0))


@st.composite
def fused_answers(draw):
    """Mostly whole fused answers; some with a pair spelt in pieces, junk tokens, alternatives missing or of other
    codes, `bytes` that disagree with `token`, cut at any length, any finish reason."""
    steps = draw(st.lists(st.tuples(st.sampled_from(CODES), st.sampled_from(LABELS)), min_size=0, max_size=4))
    tokens = [c + x for c, x in steps]
    if tokens and draw(st.booleans()):
        at = draw(st.integers(0, len(tokens) - 1))
        cut = draw(st.integers(1, len(tokens[at]) - 1))
        tokens[at:at + 1] = [tokens[at][:cut], tokens[at][cut:]]
    if draw(st.integers(0, 5)) == 0:
        tokens.insert(draw(st.integers(0, len(tokens))), draw(st.text(max_size=3)))
    entries = []
    for tok in tokens:
        alts = [{"token": p, "logprob": draw(logprob), "bytes": list(p.encode())}
                for p in draw(st.lists(st.sampled_from(PAIRS), max_size=len(PAIRS), unique=True))]
        raw = list(tok.encode())
        entries.append({"token": tok, "logprob": draw(logprob), "top_logprobs": alts,
                        "bytes": draw(st.sampled_from([raw, raw[:-1], None]))})
    finish = draw(st.sampled_from(["stop", "length"]))
    response = {"choices": [{"message": {"content": "".join(tokens)}, "finish_reason": finish,
                             "logprobs": {"content": entries}}]}
    return response, draw(st.sampled_from([3, MODE.roomy]))


def _accepted(response: dict, asked: int | None) -> dict | None:
    """The trajectory the runtime reads from `response` and its checks pass, or None when it refuses the answer."""
    try:
        trajectory = MODE.parse(response, asked)
    except TrajectoryInvalid:
        return None
    try:
        CHECKER.check(trajectory)
    except TrajectoryInvalid:
        return None
    return trajectory


@settings(max_examples=400, deadline=None)
@given(drawn=fused_answers())
def test_a_hostile_fused_answer_is_rejected_or_read_back_exactly(drawn):
    response, asked = drawn
    trajectory = _accepted(response, asked)
    if trajectory is None:
        return  # refused: the only other outcome
    choice = response["choices"][0]
    entries = choice["logprobs"]["content"]
    steps = trajectory["steps"]
    # Accepted: exactly K steps, each written as its one pair token; a `length` answer only when K were asked for.
    assert len(steps) == 3 and (choice["finish_reason"] == "stop" or asked == 3)
    assert choice["message"]["content"] == "".join(s["reasoningCode"] + s["label"] for s in steps)
    for s, entry in zip(steps, entries, strict=False):
        assert bytes(entry["bytes"] or entry["token"].encode()) == (s["reasoningCode"] + s["label"]).encode()
        assert set(s["probabilities"]) == set(LABELS)
        assert math.isclose(sum(s["probabilities"].values()), 1.0, abs_tol=1e-9)
        # Only the written code's pairs count: the probabilities follow their log-probabilities alone.
        lp = {a["token"]: a["logprob"] for a in entry["top_logprobs"]}
        assert all(s["reasoningCode"] + x in lp for x in LABELS)


def test_an_answer_spelt_in_pieces_is_not_read_even_when_whole():
    # The model wrote the right text but not as pair tokens (its retry had room): the pair probabilities of a step
    # are not where they would be read, so the answer is refused, never scored from the wrong positions.
    tokens = ["income_ok", "approve"] * 3
    alts = [{"token": p, "logprob": -1.0, "bytes": list(p.encode())} for p in PAIRS]
    entries = [{"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": alts} for t in tokens]
    response = {"choices": [{"message": {"content": "".join(tokens)}, "finish_reason": "stop",
                             "logprobs": {"content": entries}}]}
    with pytest.raises(TrajectoryInvalid, match="one pair token") as err:
        MODE.parse(response, MODE.roomy)
    assert err.value.kind == "logprobs"
