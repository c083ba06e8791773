"""What a body's bytes may be: UTF-8 JSON only (other encodings named in a 400), gzip/deflate decoded within the
body limit (a decompression bomb is a 413, not memory), other content codings a 415 naming them."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

import pytest
from arbiter_runtime.bodies import BodyTooLarge, Decoder, json_text
from arbiter_runtime.inputs import MAX_BODY_BYTES
from arbiter_runtime.protocol import BadRequest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.runtime_helpers import v2_body

CASE = {"amount": 1200, "country": "DE"}
TEXT = json.dumps(CASE)

ENCODINGS = [  # (the bytes a client sends, the encoding the 400 must name)
    (TEXT.encode("utf-16-le"), "UTF-16-LE"), (TEXT.encode("utf-16-be"), "UTF-16-BE"),
    (TEXT.encode("utf-16"), "UTF-16"),  # with its byte order mark
    (TEXT.encode("utf-32-le"), "UTF-32-LE"), (TEXT.encode("utf-32-be"), "UTF-32-BE"),
    (TEXT.encode("utf-32"), "UTF-32"),
]


@pytest.mark.parametrize("path", ["/v1/decisions", "/v2/models/credit/infer"])
@pytest.mark.parametrize("body,encoding", ENCODINGS, ids=[e for _, e in ENCODINGS])
def test_utf16_and_utf32_bodies_are_400_naming_the_encoding(runtime, path, body, encoding):
    if path != "/v1/decisions":
        body = json.dumps(v2_body(CASE)).encode(encoding.lower().replace("-", "_"))
    with runtime.client() as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert f"is {encoding}, not UTF-8" in r.json()["error"]
    assert runtime.records() == []  # nothing decided


def test_utf8_with_or_without_a_byte_order_mark_is_decided(runtime):
    with runtime.client() as c:
        plain = c.post("/v1/decisions", content=TEXT.encode(), headers={"content-type": "application/json"})
        bom = c.post("/v1/decisions", content=b"\xef\xbb\xbf" + TEXT.encode(),
                     headers={"content-type": "application/json"})
        latin1 = c.post("/v1/decisions", content='{"amount": 1, "country": "\xe9\xe9"}'.encode("latin-1"),
                        headers={"content-type": "application/json"})
    assert plain.status_code == bom.status_code == 200
    assert bom.json()["decision"] == plain.json()["decision"]
    assert latin1.status_code == 400 and "not UTF-8" in latin1.json()["error"]


@pytest.mark.parametrize("coding,encode", [
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b, wbits=-15)),  # the raw stream some clients send as deflate
    ("gzip, identity", gzip.compress), ("identity", lambda b: b),
    ("gzip", lambda b: gzip.compress(b[:10]) + gzip.compress(b[10:])),  # two gzip members (RFC 1952)
])
def test_compressed_bodies_are_decoded(runtime, coding, encode):
    with runtime.client() as c:
        plain = c.post("/v2/models/credit/infer", json=v2_body(CASE)).json()
        r = c.post("/v2/models/credit/infer", content=encode(json.dumps(v2_body(CASE)).encode()),
                   headers={"content-type": "application/json", "content-encoding": coding})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == plain["outputs"][0]["data"]


@pytest.mark.parametrize("coding,named", [("br", "'br'"), ("zstd", "'zstd'"), ("compress", "'compress'"),
                                          ("gzip, deflate", "stacked")])
def test_other_content_codings_are_415_naming_them(runtime, coding, named):
    with runtime.client() as c:
        r = c.post("/v1/decisions", content=TEXT.encode(), headers={"content-encoding": coding})
    assert r.status_code == 415 and named in r.json()["error"], r.text


@pytest.mark.parametrize("body,problem", [
    (gzip.compress(TEXT.encode(), mtime=0)[:-12], "truncated"),  # the stream stops before its end
    (b"not gzip at all", "not valid gzip"),
    (gzip.compress(TEXT.encode(), mtime=0) + b"trailing", "not valid gzip"),
], ids=["truncated", "not-gzip", "trailing-bytes"])  # stable ids: every xdist worker must collect the same tests
def test_broken_gzip_bodies_are_400(runtime, body, problem):
    with runtime.client() as c:
        r = c.post("/v1/decisions", content=body, headers={"content-encoding": "gzip"})
    assert r.status_code == 400 and problem in r.json()["error"], r.text


def _bomb(decoded: int) -> bytes:
    z = zlib.compressobj(9, wbits=31)
    zeros = b"\0" * (1 << 20)
    return b"".join(z.compress(zeros) for _ in range(decoded >> 20)) + z.flush()


BOMB = _bomb(256 << 20)  # 256 MiB of zeros in about 250 KiB


def test_a_decompression_bomb_is_413_over_http(runtime):
    with runtime.client() as c:
        r = c.post("/v1/decisions", content=BOMB, headers={"content-encoding": "gzip"})
        after = c.post("/v1/decisions", json=CASE)
    assert r.status_code == 413 and "once decoded" in r.json()["error"]
    assert after.status_code == 200


def test_a_decompression_bomb_never_holds_more_than_the_limit():
    """Fed the way the server reads it (64 KiB chunks), the decoder stops at the limit: memory stays ~ the limit."""
    decoder = Decoder("gzip", MAX_BODY_BYTES)
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            for i in range(0, len(BOMB), 65536):
                decoder.feed(BOMB[i:i + 65536])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoder.size <= MAX_BODY_BYTES + 65536
    assert peak < 1.25 * MAX_BODY_BYTES, f"peak {peak} bytes for a {256 << 20}-byte bomb"


@settings(max_examples=200, deadline=None)
@given(piece=st.binary(max_size=4096), repeat=st.sampled_from([1, 2, 40, 400]),
       cut=st.lists(st.integers(min_value=1, max_value=512), max_size=8),
       coding=st.sampled_from(["gzip", "deflate"]), limit=st.integers(min_value=0, max_value=2 << 20))
def test_any_chunking_decodes_the_same_or_refuses(piece, repeat, cut, coding, limit):
    """Whatever the chunk boundaries, the decoder gives the body back exactly, or BodyTooLarge past the limit
    (bodies up to 1.6 MB: many decoding steps, and output zlib holds back between them)."""
    data = piece * repeat
    packed = gzip.compress(data) if coding == "gzip" else zlib.compress(data)
    decoder = Decoder(coding, limit)
    out, pos = [], 0
    try:
        for n in [*cut, len(packed)]:
            out.append(decoder.feed(packed[pos:pos + n]))
            pos += n
        decoder.finish()
    except BodyTooLarge:
        assert len(data) > limit
        return
    assert len(data) <= limit and b"".join(out) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(["gzip", "deflate"]))
def test_garbage_is_a_400_never_another_error(data, coding):
    decoder = Decoder(coding, 1 << 20)
    try:
        decoder.feed(data)
        decoder.finish()
    except BadRequest:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.sampled_from(["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-32-le",
                                               "utf-32-be"]))
def test_json_text_keeps_utf8_and_refuses_what_json_would_have_guessed(text, encoding):
    data = json.dumps(text).encode(encoding)  # a JSON string starts with '"': the NUL pattern is always there
    if encoding.startswith("utf-8"):
        assert json.loads(json_text(data)) == text
    else:
        with pytest.raises(BadRequest, match=f"is {encoding.upper()}, not UTF-8"):
            json_text(data)
