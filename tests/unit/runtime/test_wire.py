"""The upstream answer's wire check: the fast check of a log-probability entry accepts exactly what the full check
accepts, for any JSON value a hostile upstream can send, and a deviation is still named where it is."""

from __future__ import annotations

import math

import pytest
from arbiter_runtime.wire import WireError, _token, check_choice, token_ok
from hypothesis import given, settings
from hypothesis import strategies as st

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
near_entries = st.fixed_dictionaries(
    {"token": st.text(max_size=3) | json_values,
     "logprob": st.floats() | st.integers(-(2**70), 5) | st.booleans() | st.just(-math.inf) | json_values},
    optional={"bytes": st.lists(st.integers(-3, 300) | st.booleans() | st.floats(0, 5), max_size=4) | json_values,
              "top_logprobs": json_values})


def _full(entry: object) -> bool:
    try:
        _token(entry, "x")
    except WireError:
        return False
    return True


@settings(max_examples=600, deadline=None)
@given(entry=near_entries | json_values)
def test_the_fast_check_accepts_exactly_what_the_full_check_accepts(entry):
    assert token_ok(entry) == _full(entry)


def _answer(entries: list) -> dict:
    return {"choices": [{"message": {"content": "x"}, "finish_reason": "stop", "logprobs": {"content": entries}}]}


GOOD = {"token": "ab", "logprob": -0.1, "bytes": [97, 98]}


@pytest.mark.parametrize(("bad", "named"), [
    ({"token": "a", "logprob": "-1"}, "logprobs.content[1].top_logprobs[0].logprob is str, not a number"),
    ({"token": "a", "logprob": 0.5}, "logprobs.content[1].top_logprobs[0].logprob is 0.5 > 0"),
    ({"token": "a", "logprob": -math.inf}, "logprobs.content[1].top_logprobs[0].logprob is -inf"),
    ({"token": "a", "logprob": -1, "bytes": [256]}, "logprobs.content[1].top_logprobs[0].bytes is not a list of byte"),
    ({"token": "a", "logprob": -1, "bytes": [True]}, "logprobs.content[1].top_logprobs[0].bytes is not a list of byte"),
    ({"logprob": -1}, "logprobs.content[1].top_logprobs[0].token is missing or not a string"),
])
def test_a_deviation_is_named_where_it_is(bad, named):
    with pytest.raises(WireError) as err:
        check_choice(_answer([dict(GOOD, top_logprobs=[GOOD]), dict(GOOD, top_logprobs=[bad, GOOD])]), True)
    assert named in str(err.value)


def test_a_well_formed_answer_passes_whole():
    choice = check_choice(_answer([dict(GOOD, top_logprobs=[GOOD, dict(GOOD, logprob=0, bytes=[])])] * 8), True)
    assert choice["finish_reason"] == "stop"
