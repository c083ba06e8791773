"""Where the members of a JSON document lie, whatever it nests: the byte ranges of an object's members or an array's
elements, found without building them, so the parts around one undecodable value can still be decoded.

Why not a library: the operator's decoders (orjson, msgspec) refuse a document nested deeper than 1,024 levels or
than Python's recursion limit, even to skip over a part they were told to ignore (measured: msgspec decoding a list
page into `list[msgspec.Raw]` items raises RecursionError on an item nested 1,100 levels deep, as orjson's loads does),
and the apiserver admits objects nested up to 10,000 levels. A streaming parser (ijson) names each value by its
whole path, so stepping over a value nested n levels costs n^2. This scanner is iterative and linear: a regular
expression finds each string and each structural character, and a counter keeps the depth.

It only locates: it does not check the document (a value is whatever lies between two separators), so what it finds
is decoded by orjson, which checks it. Used only where a decoder has refused: a Python step per token is about a
million tokens a second, slow next to orjson but bounded by the bytes the operator accepts at all.
"""

from __future__ import annotations

import re

import orjson

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|["{}\[\],:]', re.DOTALL)  # a lone quote: a string never closed
_OPEN, _CLOSE = frozenset(b"{["), frozenset(b"}]")
_QUOTE, _COMMA, _COLON = ord('"'), ord(","), ord(":")

Span = tuple[int, int]


def children(data: bytes | bytearray, start: int = 0, end: int | None = None
             ) -> tuple[bool, list[tuple[str | None, Span]], int] | None:
    """The direct children of the object or array whose first non-blank byte is at or after `start`: whether it is an
    object, (key or None for an array element, (first byte, byte after the last) of its value) for each child, and
    the byte after the container's end; None where no whole container lies there (truncated, not an object or array,
    a key that is not a string)."""
    stop = len(data) if end is None else end
    pos = start
    while pos < stop and data[pos] in b" \t\r\n":
        pos += 1
    if pos >= stop or data[pos] not in _OPEN:
        return None
    is_object = data[pos] == ord("{")
    out: list[tuple[str | None, Span]] = []
    depth, key, value_at, key_next = 0, None, pos + 1, is_object
    for m in _TOKEN.finditer(data, pos, stop):
        c = data[m.start()]
        if c == _QUOTE and m.end() - m.start() == 1:
            return None
        if depth == 1 and c == _QUOTE and key_next:
            try:
                key = orjson.loads(m.group())
            except ValueError:
                return None
            key_next = False
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                if data[value_at:m.start()].strip():
                    out.append((key, (value_at, m.start())))
                return is_object, out, m.end()
        elif depth == 1 and c == _COLON:
            value_at = m.end()
        elif depth == 1 and c == _COMMA:
            out.append((key, (value_at, m.start())))
            value_at, key, key_next = m.end(), None, is_object
    return None


def members(data: bytes | bytearray, start: int = 0, end: int | None = None) -> dict[str, Span] | None:
    """An object's members by key (the last of a repeated key, as a JSON decoder keeps it); None where `data` there is
    not a whole object."""
    found = children(data, start, end)
    if found is None or not found[0] or any(k is None for k, _ in found[1]):
        return None
    return {k: span for k, span in found[1] if k is not None}


def elements(data: bytes | bytearray, start: int = 0, end: int | None = None) -> list[Span] | None:
    """An array's elements; None where `data` there is not a whole array."""
    found = children(data, start, end)
    if found is None or found[0]:
        return None
    return [span for _, span in found[1]]
