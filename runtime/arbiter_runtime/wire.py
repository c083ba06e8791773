"""The upstream's answer checked against vLLM 0.26's chat-completions wire format before anything reads it.

Any deviation (a field of the wrong type, a missing field, a log-probability that is not a number or is positive)
is an upstream error: the answer is not used, the attempt is retried and then the rules decide, and it is counted
as arbiter_upstream_errors_total{kind="protocol"}. Parsers after this check may index without guarding.
"""

from __future__ import annotations

import math
from typing import Any

from .trajectory import TrajectoryInvalid


class WireError(TrajectoryInvalid):
    """The upstream's answer does not follow the wire format."""

    def __init__(self, message: str):
        super().__init__("protocol", f"upstream answer deviates from the chat-completions format: {message}")


def _logprob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"{where}.logprob is {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise WireError(f"{where}.logprob is {value}")
    if value > 0:
        raise WireError(f"{where}.logprob is {value:.6g} > 0 (a probability above 1)")
    return float(value)


def _token(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise WireError(f"{where} is {type(entry).__name__}, not an object")
    if not isinstance(entry.get("token"), str):
        raise WireError(f"{where}.token is missing or not a string")
    _logprob(entry.get("logprob"), where)
    b = entry.get("bytes")
    if b is not None and not (isinstance(b, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                          and 0 <= x <= 255 for x in b)):
        raise WireError(f"{where}.bytes is not a list of byte values")


_NEG_INF = -math.inf


def token_ok(entry: Any) -> bool:
    """_token's checks for the common, well-formed entry, without building a location string per entry or a
    generator per byte list: an answer carries an entry per generated token and per label at each, and check_choice
    took 156 us of the decision server's CPU on the 30-token scored answer of benchmarks/runtime_overhead.py (about 1
    ms per decision in all); 62 us with this (both timed in a loop). False is not a verdict: _token then names the
    deviation, or passes what it accepts."""
    if type(entry) is not dict:  # decoded JSON objects are dicts
        return False
    get = entry.get
    if type(get("token")) is not str:
        return False
    lp = get("logprob")
    if not ((type(lp) is float and _NEG_INF < lp <= 0.0) or (type(lp) is int and lp <= 0)):
        return False
    b = get("bytes")
    if b is None:
        return True
    if type(b) is not list:
        return False
    for x in b:  # noqa: SIM110  (a loop, not all(generator): no generator object per entry, the point here)
        if type(x) is not int or not 0 <= x <= 255:
            return False
    return True


def check_choice(response: Any, want_logprobs: bool) -> dict[str, Any]:
    """choices[0] of a well-formed answer, or WireError naming the first deviation."""
    if not isinstance(response, dict):
        raise WireError(f"the body is {type(response).__name__}, not an object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise WireError("no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise WireError("choices[0] is not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise WireError("choices[0].message is missing or not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise WireError("choices[0].message.content is not a string")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise WireError("choices[0].finish_reason is not a string")
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return choice
    if not isinstance(logprobs, dict):
        raise WireError("choices[0].logprobs is not an object")
    entries = logprobs.get("content")
    if entries is None:
        return choice
    if not isinstance(entries, list):
        raise WireError("choices[0].logprobs.content is not a list")
    if want_logprobs:
        for i, entry in enumerate(entries):
            if not token_ok(entry):
                _token(entry, f"logprobs.content[{i}]")
            top = entry.get("top_logprobs")
            if top is None:
                continue
            if not isinstance(top, list):
                raise WireError(f"logprobs.content[{i}].top_logprobs is not a list")
            for j, alt in enumerate(top):
                if not token_ok(alt):
                    _token(alt, f"logprobs.content[{i}].top_logprobs[{j}]")
    return choice
