"""JSON on the hot path: orjson where it is installed (several times faster), the standard library otherwise.

Both are strict: NaN/Infinity are not JSON and are rejected. The canonical form used for input digests and seeds
stays the standard library's (decide.canonical_json), so a digest never depends on which parser is installed.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

try:
    import orjson
except ImportError:  # pragma: no cover - the image and the venv have it
    orjson = None  # type: ignore[assignment]  # the callers test for None


def reject_constant(name: str) -> NoReturn:
    """json.loads' parse_constant: NaN, Infinity and -Infinity are not JSON (RFC 8259), whatever Python reads."""
    raise ValueError(f"{name} is not allowed in JSON")


def loads(data: str | bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # integers beyond 64 bits and the like: the standard library decides (and explains)
    return json.loads(data, parse_constant=reject_constant)


def dumps_bytes(obj: Any) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:  # e.g. an integer beyond 64 bits echoed from an input
            pass
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate in an error message that quotes the input: escape it
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()


def dumps(obj: Any) -> str:
    return dumps_bytes(obj).decode()
