"""A hostile upstream: a raw HTTP/1.1 server in front of the stand-in that misbehaves the ways real servers do.

Each chat completion takes the next behaviour from `script` (cycled): it fetches the stand-in's real answer for the
same request and then mutates it (wrong types, missing fields, impossible numbers, contradicting labels) or breaks
the transport (truncated body, reset connection, slow answer, HTTP errors, bodies that are not JSON). Everything
else (/health, /v1/models, /tokenize) is passed through. Written on raw asyncio streams so it can do what a
well-behaved framework never would (lie in Content-Length, close mid-body). A test peer: it never ships.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from support.loopback_peer import LoopbackPeer


def _choice(r):
    return r["choices"][0]


def _entries(r) -> list[dict]:
    return ((_choice(r).get("logprobs") or {}).get("content")) or []


def _label_positions(r) -> list[dict]:
    """Entries where label log-probabilities are live (the token where a label is written)."""
    return [e for e in _entries(r) if sum(1 for t in e.get("top_logprobs") or () if t["logprob"] > -9998) > 1]


def _any_entry(r, rng) -> dict | None:
    entries = _entries(r)
    return rng.choice(entries) if entries else None


def _set(path: Callable[[Any], None]):
    def mutate(r, rng):
        path(r)
        return r
    return mutate


def _entry_field(field: str, value: Any, top: bool = False):
    def mutate(r, rng):
        e = _any_entry(r, rng)
        if e is not None:
            target = rng.choice(e["top_logprobs"]) if top and e.get("top_logprobs") else e
            target[field] = copy.deepcopy(value)
        return r
    return mutate


def _positive_logprob(r, rng):
    for e in _label_positions(r) or _entries(r)[:1]:
        alts = e.get("top_logprobs") or [e]
        rng.choice(alts)["logprob"] = rng.choice([0.5, 3.0, 1e-3, 25.0])
    return r


def _flip_probabilities(r, rng):
    """Keep the text, make another label the most probable where each label is written: a self-contradiction."""
    for e in _label_positions(r):
        chosen = e["token"]
        others = [t for t in e["top_logprobs"] if t["token"] != chosen and t["logprob"] > -9998]
        if others:
            rng.choice(others)["logprob"] = -0.01
            for t in e["top_logprobs"]:
                if t["token"] == chosen:
                    t["logprob"] = -6.0
            e["logprob"] = -6.0
    return r


def _flip_generated(r, rng):
    """Generated mode: the stated label or confidence disagrees with the stated probabilities."""
    msg = _choice(r)["message"]
    try:
        doc = json.loads(msg["content"])
        step = rng.choice(doc["steps"])
        probs = step["probabilities"]
        low = min(probs, key=lambda k: probs[k])
        if rng.random() < 0.5:
            step["label"] = low
        else:
            step["confidence"] = round(min(1.0, max(probs.values()) * 0.5), 4)
        msg["content"] = json.dumps(doc)
    except (ValueError, KeyError, TypeError, IndexError):
        msg["content"] = "{}"
    return r


MUTATIONS: dict[str, Callable[[dict, random.Random], Any]] = {
    "valid": lambda r, rng: r,
    "extra_fields": _set(lambda r: r.update(unexpected={"x": [1, 2]}, choices=[{**r["choices"][0], "extra": 1}])),
    "missing_choices": _set(lambda r: r.pop("choices")),
    "choices_empty": _set(lambda r: r.update(choices=[])),
    "choices_not_list": _set(lambda r: r.update(choices={"0": r["choices"][0]})),
    "choice_not_object": _set(lambda r: r.update(choices=["oops"])),
    "message_missing": _set(lambda r: _choice(r).pop("message")),
    "message_not_object": _set(lambda r: _choice(r).update(message="hello")),
    "content_not_string": _set(lambda r: _choice(r)["message"].update(content=42)),
    "content_null": _set(lambda r: _choice(r)["message"].update(content=None)),
    "content_list": _set(lambda r: _choice(r)["message"].update(content=[{"type": "text", "text": "x"}])),
    "logprobs_null": _set(lambda r: _choice(r).update(logprobs=None)),
    "logprobs_string": _set(lambda r: _choice(r).update(logprobs="yes")),
    "logprobs_content_dict": _set(lambda r: _choice(r).update(logprobs={"content": {"a": 1}})),
    "entries_not_objects": _set(lambda r: _choice(r).update(logprobs={"content": [1, "a", None]})),
    "logprob_string": _entry_field("logprob", "-0.5"),
    "logprob_null": _entry_field("logprob", None),
    "logprob_bool": _entry_field("logprob", True),
    "logprob_object": _entry_field("logprob", {"value": -1}),
    "top_logprob_string": _entry_field("logprob", "-0.1", top=True),
    "top_logprob_null": _entry_field("logprob", None, top=True),
    "top_logprobs_dict": _entry_field("top_logprobs", {"approve": -0.1}),
    "top_logprobs_string": _entry_field("top_logprobs", "approve"),
    "top_logprobs_ints": _entry_field("top_logprobs", [1, 2, 3]),
    "token_missing": _entry_field("token", None),
    "token_int": _entry_field("token", 7, top=True),
    "bytes_string": _entry_field("bytes", "abc"),
    "bytes_out_of_range": _entry_field("bytes", [300, -1]),
    "positive_logprob": _positive_logprob,
    "flip_probabilities": _flip_probabilities,
    "flip_generated": _flip_generated,
    "finish_length": _set(lambda r: _choice(r).update(finish_reason="length")),
    "finish_int": _set(lambda r: _choice(r).update(finish_reason=3)),
    "top_level_list": lambda r, rng: [r],
    "top_level_null": lambda r, rng: None,
    "top_level_string": lambda r, rng: "ok",
}

# Text-level answers: (status, body bytes) or a transport action.
RAW = {
    "http_500": (500, b'{"error": {"message": "boom", "type": "InternalServerError", "code": 500}}'),
    "http_503": (503, b'{"error": {"message": "overloaded"}}'),
    "http_429": (429, b'{"error": {"message": "slow down"}}'),
    "http_400": (400, b'{"error": {"message": "bad request"}}'),
    "http_404": (404, b"not found"),
    "not_json": (200, b"<html><body>upstream proxy error</body></html>"),
    "empty_200": (200, b""),
    "deep_json": (200, b"[" * 20000 + b"]" * 20000),
    "huge_number": None,  # a logprob written as 1e400 (parses to infinity)
    "nan_literal": None,  # a logprob written as NaN (not JSON)
}
TRANSPORT = ("truncated", "reset", "close_no_response", "slow", "trickle", "bad_status_line", "bad_length")

BEHAVIOURS = tuple(MUTATIONS) + tuple(RAW) + TRANSPORT


class HostileUpstream(LoopbackPeer):
    """Runs on loopback in a thread with its own event loop; `script` is the list of behaviours, cycled."""

    name = "hostile-upstream"
    read_limit = 1 << 24

    def __init__(self, standin_url: str, slow_s: float = 1.0, seed: int = 0):
        self.standin_url = standin_url.rstrip("/")
        self.standin_root = self.standin_url[:-3] if self.standin_url.endswith("/v1") else self.standin_url
        self.slow_s = slow_s
        self.script: list[str] = ["valid"]
        self.calls: Counter[str] = Counter()
        self._index = 0
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def set_script(self, script: list[str]) -> None:
        with self._lock:
            self.script = list(script) or ["valid"]
            self._index = 0

    def _next(self) -> str:
        with self._lock:
            b = self.script[self._index % len(self.script)]
            self._index += 1
            self.calls[b] += 1
            return b

    # -- lifecycle --------------------------------------------------------------------------------------------
    # -- HTTP -------------------------------------------------------------------------------------------------
    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        method, path, _headers, body = await self._read_request(reader)
        return await self._respond(method, path, body, writer)

    async def _send(self, writer, status: int, body: bytes, length: int | None = None,
                    content_type: str = "application/json") -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "X")
        head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body) if length is None else length}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()

    async def _proxy(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        assert self._session is not None
        url = self.standin_root + path
        async with self._session.request(method, url, data=body or None,
                                         headers={"content-type": "application/json"} if body else None) as resp:
            return resp.status, await resp.read()

    async def _respond(self, method: str, path: str, body: bytes, writer) -> bool:
        if path != "/v1/chat/completions":
            status, content = await self._proxy(method, path, body)
            await self._send(writer, status, content)
            return True
        behaviour = self._next()
        if await self._break_connection(writer, behaviour):
            return False
        if behaviour in RAW and RAW[behaviour] is not None:
            status, content = RAW[behaviour]
            await self._send(writer, status, content)
            return True
        status, content = await self._proxy(method, path, body)
        if status != 200:
            await self._send(writer, status, content)
            return True
        answer = json.loads(content)
        if behaviour in MUTATIONS:
            try:
                answer = MUTATIONS[behaviour](answer, self._rng)
            except (KeyError, IndexError, TypeError, AttributeError):
                pass  # the answer had no such part (e.g. no logprobs in generated mode): send it as it is
            await self._send(writer, 200, json.dumps(answer).encode())
            return True
        if behaviour in ("huge_number", "nan_literal"):
            e = _entries(answer)
            if e:
                e[0]["logprob"] = "__X__"
            else:
                _choice(answer)["message"]["content"] = "__X__"
            literal = b"1e400" if behaviour == "huge_number" else b"NaN"
            await self._send(writer, 200, json.dumps(answer).encode().replace(b'"__X__"', literal))
            return True
        data = json.dumps(answer).encode()
        if behaviour == "truncated":
            await self._send(writer, 200, data[: len(data) // 2], length=len(data))
            return False
        if behaviour == "bad_length":
            await self._send(writer, 200, data, length=len(data) + 50)
            return False
        if behaviour == "slow":
            await asyncio.sleep(self.slow_s)
            await self._send(writer, 200, data)
            return True
        if behaviour == "trickle":
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                         .encode())
            step = max(1, len(data) // 10)
            for i in range(0, len(data), step):
                writer.write(data[i:i + step])
                await writer.drain()
                await asyncio.sleep(self.slow_s / 10)
            return True
        raise AssertionError(f"unknown behaviour {behaviour}")
