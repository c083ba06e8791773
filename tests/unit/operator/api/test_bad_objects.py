"""Objects the operator cannot decode are isolated one by one (api/jsonscan.py, api/kubejson.py), and a schema nested
too deep is refused by the API (api/models.py): what a user notices is that every other object of the same list page
or watch stream is read as usual, and the bad one is named, with the reason, instead of failing its whole list."""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson
import pytest
from arbiter_operator.api import jsonscan
from arbiter_operator.api.kubejson import REFUSED, loads_event, loads_list, loads_object, refused
from arbiter_operator.api.models import MAX_SCHEMA_DEPTH, DecisionModel, schema_depth
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.refuse import refusal_status, undecodable_message
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.examples import example

json_st = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8, alphabet=st.sampled_from('ab,:{}[]"\\ \n\u00e9')),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=6, alphabet=st.sampled_from('ab,:{}[]"\\ ')), inner, max_size=4), max_leaves=20)
blank_st = st.sampled_from(["", " ", "\n", " \t "])


def deep(levels: int, leaf: bytes = b"1") -> bytes:
    return b'{"a":' * levels + leaf + b"}" * levels


def item(name: str, spec: bytes = b"{}", **meta: Any) -> bytes:
    """An object as the apiserver serves it: its managedFields mirror the spec's fields (fieldsV1), so they nest as
    deep as the spec does."""
    head = json.dumps({"name": name, "namespace": "ns", "resourceVersion": "7", "uid": f"u-{name}",
                       "generation": 3, "managedFields": [{"manager": "x", "fieldsV1": "@@fields@@"}], **meta})
    head = head.replace('"@@fields@@"', spec.replace(b'"a"', b'"f:a"').decode())
    return (b'{"apiVersion":"arbiter.dev/v1alpha1","kind":"DecisionModel","metadata":' + head.encode()
            + b',"spec":' + spec + b',"status":{"observedGeneration":2}}')


@settings(max_examples=300)
@given(doc=st.dictionaries(st.text(max_size=6), json_st, max_size=5) | st.lists(json_st, max_size=5), pad=blank_st)
def test_the_scanner_finds_what_a_decoder_decodes(doc, pad):
    """Whatever the document (strings holding brackets, commas, quotes and escapes; any blank between tokens), the
    spans it finds decode to exactly the members and elements orjson decodes."""
    data = json.dumps(doc, separators=(pad + ",", ":" + pad) if pad else None).encode()
    data = pad.encode() + data + pad.encode()
    if isinstance(doc, dict):
        found = jsonscan.members(data)
        assert found is not None and jsonscan.elements(data) is None
        assert {k: orjson.loads(data[a:b]) for k, (a, b) in found.items()} == doc
    else:
        spans = jsonscan.elements(data)
        assert spans is not None and jsonscan.members(data) is None
        assert [orjson.loads(data[a:b]) for a, b in spans] == doc


# Bytes a broken or hostile peer might send: JSON's structural characters, quotes and escapes, and anything else.
hostile_bytes = st.lists(st.sampled_from([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b'"a"', b"1", b" ", b"\xff",
                                          b"null"]) | st.binary(max_size=3), max_size=80).map(b"".join)


@settings(max_examples=500)
@given(data=hostile_bytes)
def test_whatever_the_bytes_the_scanner_answers_spans_inside_them_or_none(data):
    """Never an exception, never a span outside the data or out of order: the decoders it hands spans to (orjson)
    judge what lies there."""
    found = jsonscan.children(data)
    if found is not None:
        _, spans, end = found
        assert 0 < end <= len(data)
        bounds = [b for _, span in spans for b in span]
        assert bounds == sorted(bounds) and all(0 <= b <= end for b in bounds)
    for parsed in (jsonscan.members(data), jsonscan.elements(data)):
        assert parsed is None or isinstance(parsed, (dict, list))
    try:
        loads_list(data)
    except ValueError:
        pass  # not a list: the caller's error, named
    assert refused(data, "r") is None or refused(data, "r")[REFUSED] == "r"


@given(doc=json_st.filter(lambda d: isinstance(d, (dict, list)) and d), cut=st.integers(1, 200))
def test_a_cut_document_is_no_container(doc, cut):
    data = json.dumps(doc).encode()
    cut = min(cut, len(data) - 1)
    assert jsonscan.children(data[:cut]) is None


@pytest.mark.parametrize("levels", [1_100, 3_000, 200_000])
def test_a_list_page_with_one_undecodable_item_delivers_the_others(levels):
    page = (b'{"kind":"DecisionModelList","metadata":{"resourceVersion":"9"},"items":['
            + item("good-1") + b"," + item("bad", deep(levels)) + b"," + item("good-2") + b"]}")
    with pytest.raises(ValueError):
        orjson.loads(page)  # what failed the whole list before
    doc = loads_list(page)
    assert doc["metadata"] == {"resourceVersion": "9"}
    good_1, bad, good_2 = doc["items"]
    assert good_1 == orjson.loads(item("good-1")) and good_2 == orjson.loads(item("good-2"))  # whole, as before
    assert REFUSED not in good_1 and "cannot be decoded" in bad[REFUSED]
    assert bad["metadata"] == {"name": "bad", "namespace": "ns", "resourceVersion": "7", "uid": "u-bad",
                               "generation": 3}  # managedFields dropped, as for any object
    assert bad["kind"] == "DecisionModel" and bad["status"] == {"observedGeneration": 2} and "spec" not in bad


def test_an_item_nothing_names_still_fails_its_list():
    """An item without usable metadata is a broken answer, not one bad object: the list is retried."""
    page = b'{"metadata":{"resourceVersion":"9"},"items":[' + item("ok") + b',{"spec":' + deep(2000) + b"}]}"
    with pytest.raises(ValueError):
        loads_list(page)
    with pytest.raises(ValueError):
        loads_list(b'{"metadata":{"resourceVersion":"9"},"items":[' + item("ok") + b"," + deep(2000)[:-3])


@pytest.mark.parametrize("levels", [20_000, 200_000])  # past any recursion limit (msgspec's depth follows it)
def test_a_watch_line_or_write_answer_too_deep_is_a_stand_in(levels):
    line = b'{"type":"MODIFIED","object":' + item("bad", deep(levels)) + b"}"
    type_, obj = loads_event(line, False)
    assert type_ == "MODIFIED" and obj["metadata"]["name"] == "bad" and REFUSED in obj
    assert loads_object(item("bad", deep(levels)))["metadata"]["uid"] == "u-bad"
    assert loads_event(line[:-20], False) is None  # cut: not an event at all


@pytest.mark.parametrize("levels", [1_100, 3_000])
def test_the_cache_reads_back_what_it_holds_or_a_stand_in(levels):
    """msgspec (watch lines) may decode deeper than orjson (the cache's reads) goes: a pass still reads a stand-in."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(levels + 500)  # msgspec's depth follows Python's recursion limit, which a caller may raise
    try:
        cache = WatchCache()
        line = b'{"type":"MODIFIED","object":' + item("bad", deep(levels)) + b"}"
        _, obj = loads_event(line, False)
        cache.put(obj)
    finally:
        sys.setrecursionlimit(limit)
    read = cache.get("arbiter.dev/v1alpha1", "DecisionModel", "ns", "bad")
    assert read is not None and REFUSED in read and read["metadata"]["uid"] == "u-bad"
    assert [o["metadata"]["name"] for o in cache.list("arbiter.dev/v1alpha1", "DecisionModel", "ns", [])] == ["bad"]


def test_a_normal_page_decodes_as_before():
    page = b'{"metadata":{"resourceVersion":"9"},"items":[' + item("a", deep(600)) + b"]}"
    assert loads_list(page) == orjson.loads(page)


def _dm(schema: Any) -> dict[str, Any]:
    dm = example()
    dm["spec"]["versions"][0]["metadata"]["outputSchema"] = schema
    return dm


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"x": schema}}  # each level: two (properties, then the schema)
    return schema


def test_a_schema_nested_past_the_limit_is_refused_and_one_at_it_is_not():
    at_limit: Any = {}
    for _ in range(MAX_SCHEMA_DEPTH - 1):
        at_limit = {"a": at_limit}
    assert schema_depth(at_limit) == MAX_SCHEMA_DEPTH
    DecisionModel.model_validate(_dm(at_limit))
    with pytest.raises(ValidationError) as caught:
        DecisionModel.model_validate(_dm({"a": at_limit}))
    assert f"nested deeper than {MAX_SCHEMA_DEPTH} levels" in str(caught.value)
    with pytest.raises(ValidationError):
        DecisionModel.model_validate(_dm(orjson.loads(deep(600))))
    DecisionModel.model_validate(_dm(_nested(20)))  # a realistic deep schema passes


def test_depth_is_counted_without_recursion():
    value: Any = []
    for _ in range(100_000):
        value = [value]
    assert schema_depth(value, limit=10) == 11
    assert schema_depth(value, limit=200_000) == 100_001


def test_the_refusal_status_names_the_limit_and_keeps_the_rest():
    from datetime import UTC, datetime
    raw = refused(item("bad", deep(2000)), "it cannot be decoded (depth limit exceeded)")
    assert raw is not None
    raw["status"] = {"observedGeneration": 2, "promotion": {"stable": "1.0.0"}}
    status = refusal_status(raw, undecodable_message(raw), datetime(2026, 1, 1, tzinfo=UTC))
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Ready"]["status"], conds["Reconciling"]["status"]) == \
        ("True", "False", "False")
    assert {c["reason"] for c in conds.values()} == {"InvalidSpec"}
    assert {c["observedGeneration"] for c in conds.values()} == {3} and status["observedGeneration"] == 3
    assert "1,024 levels" in conds["Ready"]["message"] and f"at most {MAX_SCHEMA_DEPTH}" in conds["Ready"]["message"]
