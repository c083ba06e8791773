"""The scored answer formats (`scoredFormat`): compact (code and label only, every token a choice) and lines.

Against the stand-in upstream, which decodes token by token under the regex the runtime sends, as vLLM's grammar
backend does: the compact format costs 2 tokens per step (generation ends on the last label when every name is one
token of the tokenizer; one more, the end of sequence, when not), the lines format 4 per step plus the end.
A hostile upstream answering in the compact format never gets a half-parsed, cut or inconsistent trajectory through.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
from arbiter_devenv.vllm_standin import StandinServer
from arbiter_runtime.config import ConfigError, parse_config
from arbiter_runtime.decide import ScoredMode, canonical_json, derive_seed
from arbiter_runtime.scored_format import scored_format
from arbiter_runtime.tokens import LabelTokens
from arbiter_runtime.trajectory import TrajectoryChecker, TrajectoryInvalid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.runtime_helpers import CODES, LABELS, base_config

CASE = {"amount": 1200, "country": "DE"}


@pytest.fixture
def words_standin():
    """A model whose codes and labels are all single tokens wherever they stand (what adding them to the tokenizer
    when fine-tuning gives)."""
    server = StandinServer(words=(*LABELS, *CODES), served_model_name="credit-v1", added_tokens=True).start()
    try:
        yield server
    finally:
        server.stop()


def _completion_tokens(server: StandinServer, body: dict) -> tuple[int, str]:
    r = httpx.post(server.url + "/chat/completions", json=body, timeout=10)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"], r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("fmt, per_step", [("compact", 2), ("lines", 4)])
def test_each_format_decides_through_the_server_and_costs_what_it_says(words_standin, make_runtime, fmt, per_step):
    steps = 4
    server = make_runtime(base_config(words_standin.url, scoredFormat=fmt, steps=steps))
    with server.client() as c:
        answer = c.post("/v1/decisions", json=CASE).json()
    assert answer["source"] == "model", answer
    trajectory = answer["trajectory"]["steps"]
    assert [s["step"] for s in trajectory] == [1, 2, 3, 4]
    assert all(s["reasoningCode"] in CODES and s["label"] in LABELS for s in trajectory)
    assert all(math.isclose(sum(s["probabilities"].values()), 1.0, abs_tol=1e-9) for s in trajectory)
    # The same body the server sent, sent again: the upstream's usage shows the generated tokens.
    body = words_standin.state.requests[-1]
    regex = body["structured_outputs"]["regex"]
    if fmt == "compact":
        assert ":" not in regex and "\\n" not in regex
    tokens, content = _completion_tokens(words_standin, body)
    # compact: generation ends on the last label (no forced end of sequence); lines: + the end of sequence
    assert tokens == per_step * steps + (fmt == "lines"), (tokens, content)
    assert body["max_tokens"] == (8 if fmt == "compact" else scored_format(fmt, LABELS, CODES, steps).max_tokens)
    # The runtime re-inserts what the compact format leaves out: the trajectory spells the same codes and labels.
    joiner, end = ("", "") if fmt == "compact" else (":", "\n")
    assert content == "".join(f"{s['reasoningCode']}{joiner}{s['label']}{end}" for s in trajectory)


def test_a_code_of_several_tokens_keeps_room_for_the_end_of_sequence(words_standin, make_runtime):
    # "no_history" is no word of the tokenizer: spelt in pieces, so the exact count is not known.
    codes = [*CODES, "no_history"]
    server = make_runtime(base_config(words_standin.url, reasoningCodes=codes, steps=3))
    with server.client() as c:
        assert c.post("/v1/decisions", json=CASE).json()["source"] == "model"
    body = words_standin.state.requests[-1]
    assert body["max_tokens"] == scored_format("compact", LABELS, codes, 3).max_tokens > 6
    assert words_standin.state.usage.finished == {"stop": 1}


def test_a_cut_answer_is_never_read_and_its_retry_gets_room(words_standin, make_runtime):
    server = make_runtime(base_config(words_standin.url, steps=3))
    words_standin.set("truncated", count=1)  # the first answer stops after 3 tokens, finish_reason length
    with server.client() as c:
        answer = c.post("/v1/decisions", json=CASE).json()
    assert answer["source"] == "model" and len(answer["trajectory"]["steps"]) == 3
    first, retry = words_standin.state.requests[-2:]
    assert first["max_tokens"] == 6 and retry["max_tokens"] > 6
    record = server.records()[-1]
    assert record["attempts"] == 2
    assert server.runtime.metrics.schema_violations.labels("credit", "v1", "length")._value.get() == 1


def test_the_system_prompt_describes_the_format_the_constraint_enforces(words_standin, make_runtime):
    server = make_runtime(base_config(words_standin.url, scoredFormat="compact"))
    with server.client() as c:
        c.post("/v1/decisions", json=CASE).raise_for_status()
    system = words_standin.state.requests[-1]["messages"][0]["content"]
    assert "no separator" in system and all(x in system for x in (*LABELS, *CODES))


def test_compact_is_the_default():
    assert parse_config(base_config("http://127.0.0.1:1/v1")).scored_format == "compact"


@pytest.mark.parametrize("overrides, message", [
    ({"reasoningCodes": ["debt", "debt_high", "thin_file"]}, "'debt' is the start of 'debt_high'"),
    ({"labels": ["approve", "approved"], "fallbackRules": []}, "'approve' is the start of 'approved'"),
    ({"scoredFormat": "csv"}, "must be one of compact, fused, lines"),
])
def test_names_the_compact_format_cannot_read_back_are_refused_with_what_to_do(overrides, message):
    with pytest.raises(ConfigError) as err:
        parse_config(base_config("http://127.0.0.1:1/v1", **overrides))
    assert message in str(err.value)
    if "scoredFormat" not in overrides:
        assert "scoredFormat: lines" in str(err.value)
        # ...which then works, as does generated mode.
        parse_config(base_config("http://127.0.0.1:1/v1", scoredFormat="lines", **overrides))
        parse_config(base_config("http://127.0.0.1:1/v1", trajectoryMode="generated", **overrides))


def test_a_label_merged_into_its_code_token_is_refused_at_start_up(make_runtime):
    # The tokenizer merges "ok" + "A" into one token "okA": in the compact format the label has no token of its own.
    upstream = StandinServer(words=("A", "R", "ok", "okA"), served_model_name="credit-v1").start()
    try:
        server = make_runtime(base_config(upstream.url, labels=["A", "R"], reasoningCodes=["ok"], fallbackRules=[]),
                              wait_ready=False)
        import time

        deadline = time.monotonic() + 10
        with server.client() as c:
            while time.monotonic() < deadline:
                r = c.get("/v2/health/ready")
                if "cannot run in scored mode" in r.text:
                    break
                time.sleep(0.05)
        assert r.status_code == 503 and "'A' after 'ok' tokenizes as" in r.json()["error"]
    finally:
        upstream.stop()


# ---------------------------------------------------------------- a hostile upstream, in the compact format

LABEL_IDS = {label: 100 + i for i, label in enumerate(LABELS)}
COMPACT = parse_config(base_config("http://127.0.0.1:1/v1", steps=3))
MODE = ScoredMode(COMPACT, LabelTokens(label_ids=LABEL_IDS, code_ids={}, source="test"))
CHECKER = TrajectoryChecker(COMPACT)

logprob = st.one_of(st.floats(min_value=-30, max_value=0), st.just(-9999.0), st.just(float("-inf")),
                    st.just(float("nan")), st.just(5.0))
pieces = st.one_of(st.sampled_from([*LABELS, *CODES]), st.sampled_from(["", ":", "\n", "app", "income_", "é", " "]),
                   st.text(max_size=4))


@st.composite
def hostile_answers(draw):
    """Mostly near-valid compact answers: right names with junk spliced in, tokens split anywhere, label
    log-probabilities missing, masked, NaN or positive, `bytes` that disagree with `token`."""
    parts = draw(st.lists(pieces, min_size=0, max_size=8))
    if draw(st.booleans()):
        parts = [x for step in range(3) for x in (draw(st.sampled_from(CODES)), draw(st.sampled_from(LABELS)))]
        if draw(st.booleans()):
            parts.insert(draw(st.integers(0, len(parts))), draw(pieces))
    tokens = []
    for part in parts:
        cut = draw(st.integers(0, len(part)))
        tokens += [t for t in (part[:cut], part[cut:]) if t] if draw(st.booleans()) else ([part] if part else [])
    entries = []
    for tok in tokens:
        alts = [{"token": label, "logprob": draw(logprob), "bytes": list(label.encode())}
                for label in draw(st.lists(st.sampled_from(LABELS), max_size=4))]
        raw = list(tok.encode())
        entries.append({"token": tok, "logprob": draw(logprob),
                        "bytes": draw(st.one_of(st.just(raw), st.just(raw[:-1]), st.none())), "top_logprobs": alts})
    choice = {"message": {"content": draw(st.one_of(st.just("".join(tokens)), st.none(), st.integers()))},
              "finish_reason": draw(st.sampled_from(["stop", "length", None])),
              "logprobs": draw(st.one_of(st.just({"content": entries}), st.none(), st.just({"content": "x"})))}
    return {"choices": [choice]}


@settings(max_examples=400, deadline=None)
@given(response=hostile_answers())
def test_a_hostile_compact_answer_is_rejected_or_read_back_exactly(response):
    try:
        trajectory = MODE.parse(response)
        CHECKER.check(trajectory)
    except TrajectoryInvalid:
        return
    choice = response["choices"][0]
    content = choice["message"]["content"]
    steps = trajectory["steps"]
    # Accepted: the answer was exactly K code+label pairs, finished (the bound was asked for: a `length` answer is
    # cut), and every step has finite probabilities that sum to 1 over all labels, the chosen label among them.
    assert choice["finish_reason"] != "length"
    assert content == "".join(s["reasoningCode"] + s["label"] for s in steps)
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert set(s["probabilities"]) == set(LABELS)
        assert all(math.isfinite(p) and 0 <= p <= 1 for p in s["probabilities"].values())
        assert math.isclose(sum(s["probabilities"].values()), 1.0, abs_tol=1e-9)
        assert s["confidence"] == max(s["probabilities"].values())


def _answer(tokens: list[str], finish: str) -> dict:
    """A vLLM-shaped answer writing `tokens`, every label position carrying every label's log-probability."""
    entries = [{"token": t, "logprob": -0.1, "bytes": list(t.encode()),
                "top_logprobs": [{"token": x, "logprob": -0.1 if x == t else -2.0, "bytes": list(x.encode())}
                                 for x in LABELS]} for t in tokens]
    return {"choices": [{"message": {"content": "".join(tokens)}, "finish_reason": finish,
                         "logprobs": {"content": entries}}]}


EXACT = ScoredMode(COMPACT, LabelTokens(label_ids=LABEL_IDS, code_ids={c: [200 + i] for i, c in enumerate(CODES)},
                                         source="test", single_token_steps=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CODES), st.sampled_from(LABELS)), min_size=3, max_size=3),
       st.integers(min_value=0, max_value=6), st.booleans(), st.sampled_from([6, 7, EXACT.roomy, None]))
def test_an_answer_stopped_at_max_tokens_is_read_only_when_whole(pairs, cut, spelt, asked):
    """max_tokens = 2K ends generation on the last label (finish_reason length); a model that spells a name in
    pieces is cut short there. Only the whole answer of exactly the 2K tokens asked for is read; a cut one, or a
    `length` under any other max_tokens, is a `length` violation, never a decision."""
    assert EXACT.request("{}", 1)["max_tokens"] == 6
    tokens = [t for code, label in pairs for t in ((code[:3], code[3:]) if spelt else (code,)) + (label,)]
    response = _answer(tokens[:cut] if cut < 6 else tokens[:6], "length")
    if not spelt and cut == 6 and asked == 6:
        steps = EXACT.parse(response, asked)["steps"]
        assert [(s["reasoningCode"], s["label"]) for s in steps] == pairs
        return
    for mode in (EXACT, MODE):
        with pytest.raises(TrajectoryInvalid) as err:
            mode.parse(response, asked)
        assert err.value.kind == "length"


class _Hostile:
    """An upstream that answers every chat completion with the next drawn body (status, JSON or raw bytes)."""

    def __init__(self):
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Route

        self.next: tuple[int, bytes] = (200, b"{}")
        tokenizer = StandinServer(words=(*LABELS, *CODES)).state.tokenizer

        async def chat(_):
            return Response(self.next[1], status_code=self.next[0], media_type="application/json")

        async def tokenize(request):
            text = (await request.json())["prompt"]
            return Response(json.dumps({"tokens": tokenizer.encode(text, add_special_tokens=False).ids}),
                            media_type="application/json")

        async def health(_):
            return Response(status_code=200)

        self.app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                     Route("/tokenize", tokenize, methods=["POST"]),
                                     Route("/health", health)])


@pytest.fixture(scope="module")
def hostile_stack():
    import threading
    import time

    import uvicorn
    from arbiter_devenv.vllm_standin import free_port
    from support.runtime_helpers import RuntimeServer

    hostile = _Hostile()
    port = free_port()
    up = uvicorn.Server(uvicorn.Config(hostile.app, host="127.0.0.1", port=port, log_level="warning",
                                       lifespan="off"))
    thread = threading.Thread(target=up.run, daemon=True)
    thread.start()
    while not up.started:
        time.sleep(0.01)
    server = RuntimeServer(base_config(f"http://127.0.0.1:{port}/v1", steps=3,
                                       upstream={"url": f"http://127.0.0.1:{port}/v1",
                                                 "servedModelName": "credit-v1", "maxRetries": 0})).start()
    try:
        yield hostile, server
    finally:
        server.stop()
        up.should_exit = True
        thread.join(10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(response=hostile_answers(), status=st.sampled_from([200, 200, 200, 500]),
       garble=st.sampled_from([None, b"", b"{", b"[1]", b"null"]))
def test_the_server_answers_a_hostile_compact_upstream_with_a_checked_decision(hostile_stack, response, status,
                                                                              garble):
    hostile, server = hostile_stack
    body = garble if garble is not None else json.dumps(response, allow_nan=True).encode()
    hostile.next = (status, body)
    with server.client() as c:
        r = c.post("/v1/decisions", json=CASE)
    # Never a 500: the model's decision when the answer holds up, else the rules' (this config ends with a
    # catch-all rule).
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["source"] in ("model", "rules")
    if answer["source"] == "model":
        CHECKER.check(answer["trajectory"])
        assert "".join(s["reasoningCode"] + s["label"] for s in answer["trajectory"]["steps"]) == \
            response["choices"][0]["message"]["content"]
    else:
        assert answer["decision"] in LABELS and answer["fallbackReason"] in ("invalid", "upstream_error")


def test_direct_body_and_seed_are_the_same_in_both_formats():
    # Only the constraint and the prompt's format sentence differ between the formats: same seed, same input.
    lines = ScoredMode(parse_config(base_config("http://127.0.0.1:1/v1", steps=3, scoredFormat="lines")),
                       LabelTokens(label_ids=LABEL_IDS, code_ids={}, source="test"))
    canonical = canonical_json(CASE)
    a = MODE.request(canonical, derive_seed(COMPACT, canonical))
    b = lines.request(canonical, derive_seed(lines.cfg, canonical))
    assert a["seed"] == b["seed"] and a["messages"][1] == b["messages"][1]
    assert a["max_tokens"] < b["max_tokens"] and a["structured_outputs"] != b["structured_outputs"]
