"""The edge's settings, the upstream answer's byte bound and the deadline reserve's recovery, without sockets (the
sockets are in tests/cluster/runtime/test_edge.py)."""

from __future__ import annotations

import copy
import json
import resource
from pathlib import Path

import pytest
from arbiter_runtime.config import parse_config
from arbiter_runtime.decide import DeadlineReserve, GeneratedMode, ScoredMode
from arbiter_runtime.edge import FD_RESERVE, EdgeConfigError, EdgeLimits, arrived
from arbiter_runtime.tokens import LabelTokens
from support.runtime_helpers import base_config

EXAMPLE = json.loads((Path(__file__).parent / "data" / "scored-response-example.json").read_text())


def test_edge_settings_come_from_the_environment_with_documented_defaults():
    assert EdgeLimits.from_env({}) == EdgeLimits(10.0, 30.0, 32768, 0)
    got = EdgeLimits.from_env({"ARBITER_HEADER_TIMEOUT_S": "2.5", "ARBITER_BODY_TIMEOUT_S": "4",
                               "ARBITER_MAX_HEADER_BYTES": "65536", "ARBITER_MAX_CONNECTIONS": "100"})
    assert got == EdgeLimits(2.5, 4.0, 65536, 100)


@pytest.mark.parametrize("name, value", [("ARBITER_HEADER_TIMEOUT_S", "soon"), ("ARBITER_BODY_TIMEOUT_S", "0"),
                                         ("ARBITER_MAX_HEADER_BYTES", "512"), ("ARBITER_MAX_CONNECTIONS", "-1"),
                                         ("ARBITER_MAX_HEADER_BYTES", "1.5")])
def test_a_bad_edge_setting_is_refused_naming_the_variable(name, value):
    with pytest.raises(EdgeConfigError, match=name):
        EdgeLimits.from_env({name: value})


def test_the_connection_cap_stays_below_the_descriptor_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert EdgeLimits().connection_cap(512) == soft - 512 - FD_RESERVE
    assert EdgeLimits(max_connections=100).connection_cap(512) == min(100, soft - 512 - FD_RESERVE)


def test_the_arrival_is_the_edge_stamp_or_now():
    assert arrived({"extensions": {"arbiter.edge": {"arrived": 12.5}}}) == 12.5
    assert arrived({"type": "http"}) > 0


def _padded_to(answer: dict, tokens: int) -> bytes:
    """The real answer with its largest log-probability entry repeated to `tokens` positions."""
    padded = copy.deepcopy(answer)
    entries = padded["choices"][0]["logprobs"]["content"]
    biggest = max(entries, key=lambda e: len(json.dumps(e)))
    padded["choices"][0]["logprobs"]["content"] = [biggest] * tokens
    padded["choices"][0]["message"]["content"] = "\u00e9" * tokens * 4  # text that escapes: 4 bytes a token
    return json.dumps(padded).encode()


def test_an_honest_answer_of_max_tokens_tokens_fits_its_bound():
    # The config the real vLLM 0.26 example answered: 3 steps of `ok:A|R` (the lines format).
    cfg = parse_config(base_config("http://127.0.0.1:1/v1", labels=["A", "R"], reasoningCodes=["ok"], steps=3,
                                   fallbackRules=[], scoredFormat="lines"))
    mode = ScoredMode(cfg, LabelTokens(label_ids={"A": 65, "R": 82}, code_ids={"ok": [1, 2]}, source="test"))
    max_tokens = mode._base["max_tokens"]
    assert len(json.dumps(EXAMPLE)) * 10 < mode.max_answer_bytes
    assert len(_padded_to(EXAMPLE, max_tokens)) < mode.max_answer_bytes
    generated = GeneratedMode(parse_config(base_config("http://127.0.0.1:1/v1", trajectoryMode="generated")))
    assert generated.max_answer_bytes > 1024 * 128 * 6  # 1024 tokens of the longest, all escaped
    assert generated.max_answer_bytes < 8 << 20  # and still bounded


def test_the_reserve_gives_the_model_its_time_back_once_the_upstream_answers_again():
    r = DeadlineReserve(0.200)
    for _ in range(1000):  # a stall: every decision a late deadline fallback
        r.observe(1.0)
    assert r.s == pytest.approx(0.100)
    for _ in range(300):  # the upstream is healthy again: model answers within their budget
        r.relax()
    assert r.s <= 0.15 * 0.200  # the model gets at least 85% of deadlineMs
    assert r.s >= r.floor
