"""The request boundary: read a body within its limit, check its content type, and canonicalise each input document.

Everything a caller sends is checked here once, so the decision path (prompt, digest, seed, rules) only ever sees
documents it can handle: valid Unicode, bounded nesting, numbers a double can hold, integral numbers written one way.
The limits are stated in docs/runtime.md ("Input limits").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from .bodies import BodyTooLarge, Decoder, UnsupportedMediaType, content_coding, json_text
from .protocol import BadRequest, loads_strict
from .tensor_binary import HEADER_LENGTH, split_body

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 32  # objects/arrays nested in one input document
# Integral numbers up to 2**53 are exactly representable as doubles: below it 1200.0 is the integer 1200.
EXACT_INTEGER = 2 ** 53
MAX_DOUBLE = 1.7976931348623157e308


__all__ = ["BodyTooLarge", "UnsupportedMediaType", "canonicalise", "read_json"]


def check_content_type(header: str | None, framed: bool = False) -> None:
    """JSON only: application/json or application/*+json, UTF-8. No header is read as JSON (curl without -H).
    A body framed by the binary tensor extension (`framed`) may also be application/octet-stream (KServe's SDK)."""
    if header is None or not header.strip():
        return
    media, _, params = header.partition(";")
    media = media.strip().lower()
    if framed and media == "application/octet-stream":
        return
    if media == "application/octet-stream":
        raise UnsupportedMediaType(f"content type 'application/octet-stream' needs the {HEADER_LENGTH} header of "
                                   "the binary tensor data extension (V2 infer only); otherwise send application/json")
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaType(f"content type {media[:80]!r} is not supported; send the body as "
                                   "application/json")
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"charset {value.strip()[:40]!r} is not supported; JSON is UTF-8")


async def read_limited(headers: Mapping[str, str], stream: AsyncIterator[bytes], limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body with its content coding undone, or BodyTooLarge as soon as more than `limit` bytes arrived
    or were decoded (chunked bodies included): the server never holds more than `limit` of either."""
    coding = content_coding(headers.get("content-encoding"))
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise BadRequest("invalid Content-Length")
        if int(length) > limit:
            raise BodyTooLarge(f"request body larger than {limit} bytes")
    decoder = Decoder(coding, limit) if coding else None
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body larger than {limit} bytes")
        chunks.append(decoder.feed(chunk) if decoder else chunk)
    if decoder:
        chunks.append(decoder.finish())
    return b"".join(chunks)


async def read_json(headers: Mapping[str, str], stream: AsyncIterator[bytes],
                    framed: bool = False) -> tuple[Any, bytes]:
    """The body's JSON document and, when `framed` allows the binary tensor extension and the request uses it,
    the binary data after it; 400/413/415 naming the problem otherwise."""
    framing = headers.get(HEADER_LENGTH)
    if framing is not None and not framed:
        raise BadRequest(f"{HEADER_LENGTH} (binary tensor data) is only read by the V2 infer endpoints")
    check_content_type(headers.get("content-type"), framing is not None)
    body = await read_limited(headers, stream, MAX_BODY_BYTES)
    if not body:
        raise BadRequest("request body is empty; send a JSON document")
    head, binary = split_body(body, framing)
    text = json_text(head, "the JSON header" if framing is not None else "request body")
    try:
        return loads_strict(text), binary
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not JSON: {str(exc)[:200]}") from None


def _where(path: list[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(root)"


def canonicalise(document: Any) -> Any:
    """A copy of `document` the rest of the runtime can trust, or BadRequest naming the field.

    - every string and key is valid Unicode (no lone surrogates from `\\ud800` escapes): it must encode as UTF-8;
    - nesting is at most MAX_DEPTH levels;
    - every number fits a double (the rules see doubles); an integral number within +-2**53 becomes an int, so
      `1200` and `1200.0` are one input (same schema verdict, digest, seed, prompt and decision).
    """
    return _canon(document, [], 0)


def _text(value: str, path: list[Any], what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"field '{_where(path)}': {what} is not valid Unicode (a lone surrogate at character "
                         f"{exc.start}); send UTF-8 text") from None
    return value


def _canon(value: Any, path: list[Any], depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, path, "the string")
    if isinstance(value, int):
        if abs(value) > MAX_DOUBLE:
            raise BadRequest(f"field '{_where(path)}': number out of range (at most {MAX_DOUBLE:.6g} in magnitude)")
        return value
    if isinstance(value, float):
        if value != value or abs(value) > MAX_DOUBLE:
            raise BadRequest(f"field '{_where(path)}': number out of range")
        if value.is_integer() and abs(value) <= EXACT_INTEGER:
            return int(value)
        return value
    if depth >= MAX_DEPTH:
        raise BadRequest(f"field '{_where(path)}': nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            _text(k, [*path, k.encode("utf-8", "replace").decode()], "the key")
            out[k] = _canon(v, [*path, k], depth + 1)
        return out
    if isinstance(value, list):
        return [_canon(v, [*path, i], depth + 1) for i, v in enumerate(value)]
    raise BadRequest(f"field '{_where(path)}': not a JSON value")


