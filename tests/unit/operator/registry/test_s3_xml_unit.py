"""clients.s3_xml: S3's listing and error documents read back exactly, and anything else refused by name."""

from __future__ import annotations

from arbiter_operator.clients.s3_xml import (
    MAX_DEPTH,
    MAX_FIELD_CHARS,
    MalformedAnswer,
    parse_error_code,
    parse_listing,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from support.hostile_s3 import error_xml, listing_xml

keys = st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
                          st.integers(0, 5 << 40)), max_size=30)


@settings(max_examples=300)
@given(listed=keys, truncated=st.booleans(), token=st.none() | st.text("abcXYZ019+/=", min_size=1, max_size=60))
def test_a_listing_reads_back_exactly(listed, truncated, token):
    page = parse_listing(listing_xml(listed, truncated=truncated, token=token), max_keys=1000)
    assert [(o.key, o.size) for o in page.objects] == listed
    assert all(o.etag == f"{size:032x}" for o, (_, size) in zip(page.objects, listed, strict=True))
    assert (page.truncated, page.next_token) == (truncated, token)


@settings(max_examples=500)
@given(body=st.binary(max_size=600) | st.text(max_size=600).map(str.encode))
def test_any_bytes_are_a_listing_or_refused_by_name(body):
    try:
        page = parse_listing(body, max_keys=1000)
    except MalformedAnswer as exc:
        assert 0 < len(str(exc)) < 200  # names the problem; never the whole document
    else:
        assert all(o.size >= 0 for o in page.objects)
    code = parse_error_code(body)
    assert code is None or (0 < len(code) <= 64 and code.isascii())


def _refused(body: bytes, why: str) -> None:
    try:
        parse_listing(body, max_keys=1000)
    except MalformedAnswer as exc:
        assert why in str(exc), str(exc)
    else:
        raise AssertionError("accepted")


def test_what_s3_never_sends_is_refused_with_the_reason():
    _refused(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><ListBucketResult/>', "declares a DTD")
    _refused(b"<ListBucketResult>" + b"<a>" * MAX_DEPTH + b"</a>" * MAX_DEPTH + b"</ListBucketResult>",
             f"nested deeper than {MAX_DEPTH}")
    long_key = b"k" * (MAX_FIELD_CHARS + 1)
    _refused(b"<ListBucketResult><Contents><Key>" + long_key + b"</Key></Contents></ListBucketResult>", "longer than")
    _refused(b"<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>", "byte count")
    _refused(b"<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>", "without a <Key>")
    _refused(b"<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>", "neither true nor false")
    _refused(b"<Error><Code>AccessDenied</Code></Error>", "not <ListBucketResult>")
    try:
        parse_listing(listing_xml([("k", 1)] * 3), max_keys=2)
    except MalformedAnswer as exc:
        assert "more than 2 objects" in str(exc)
    else:
        raise AssertionError("a page longer than asked for was accepted")


def test_error_codes_are_read_only_when_they_look_like_codes():
    assert parse_error_code(error_xml("NoSuchBucket")) == "NoSuchBucket"
    assert parse_error_code(error_xml("Access Denied\nnow")) is None
    assert parse_error_code(error_xml("x" * 65)) is None
    assert parse_error_code(b"<html>503</html>") is None
