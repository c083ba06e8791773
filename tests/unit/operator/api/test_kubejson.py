"""The operator's decoding of watched and written objects (api/kubejson.py): whatever an apiserver sends, the result is
what a generic JSON decode gives, minus exactly the parts the operator never reads (managedFields; a Deployment's or
pod's spec; top-level fields the kind does not have). Bytes that are not JSON never raise."""

from __future__ import annotations

import json
from typing import Any

from arbiter_operator.api.kubejson import event_head, loads_event, loads_object
from arbiter_operator.kube.kinds import STATUS_ONLY
from hypothesis import given, settings
from hypothesis import strategies as st

META_KEYS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
             "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
             "ownerReferences", "finalizers")
TOP_KEYS = ("apiVersion", "kind", "metadata", "spec", "status", "data", "binaryData", "immutable")

scalar = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False,
                                                                                allow_infinity=False) | st.text()
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=10)
meta = st.dictionaries(st.sampled_from([*META_KEYS, "managedFields", "unknownField"]), value, max_size=8)
obj = st.dictionaries(st.sampled_from([*TOP_KEYS, "extra", "items"]), value, max_size=8).flatmap(
    lambda o: st.one_of(st.just(o), meta.map(lambda m: {**o, "metadata": m})))
kind = st.sampled_from(["InferenceService", "Deployment", "Pod", "ConfigMap", None])


def expected(o: Any, kind: str | None) -> Any:
    if not isinstance(o, dict) or ("metadata" in o and not isinstance(o["metadata"], dict)):
        return o  # not shaped like an object: handed over as decoded, for the caller's checks to refuse
    top = ("apiVersion", "kind", "metadata", "status") if kind in STATUS_ONLY else TOP_KEYS
    kept = {k: v for k, v in o.items() if k in top}
    if "metadata" in o:
        kept["metadata"] = {k: v for k, v in o["metadata"].items() if k in META_KEYS}
    return kept


@settings(max_examples=400, deadline=None)
@given(o=obj, kind=kind)
def test_an_object_decodes_as_sent_without_the_parts_never_read(o, kind):
    assert loads_object(json.dumps(o).encode(), kind in STATUS_ONLY) == expected(o, kind)


@settings(max_examples=400, deadline=None)
@given(o=obj | value, kind=kind, type_=st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", 5, None]))
def test_a_watch_event_decodes_as_sent_without_the_parts_never_read(o, kind, type_):
    line = json.dumps({"type": type_, "object": o}).encode()
    assert loads_event(line, kind in STATUS_ONLY) == (type_, expected(o, kind))


@given(status=value, kind=kind)
def test_an_error_events_status_comes_whole(status, kind):
    line = json.dumps({"type": "ERROR", "object": status}).encode()
    assert loads_event(line, kind in STATUS_ONLY) == ("ERROR", status)


@settings(max_examples=400, deadline=None)
@given(line=st.binary(max_size=64) | value.map(lambda v: json.dumps(v).encode()), kind=kind)
def test_any_line_is_an_event_or_nothing_and_never_raises(line, kind):
    out = loads_event(line, kind in STATUS_ONLY)
    assert out is None or (isinstance(out, tuple) and len(out) == 2)


@settings(max_examples=400, deadline=None)
@given(o=obj | value, type_=st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", 5, None]))
def test_an_events_head_is_what_the_whole_decode_finds(o, type_):
    """The cheap look at a watch line (type, namespace, name, resourceVersion) names exactly what decoding the whole
    line names, or nothing where any of the four is not a string: a skipped event is never one of another object."""
    line = json.dumps({"type": type_, "object": o}).encode()
    head = event_head(line)
    decoded = loads_event(line)
    assert decoded is not None
    meta = decoded[1].get("metadata") if isinstance(decoded[1], dict) else None
    parts = (decoded[0], *((meta.get(k) for k in ("namespace", "name", "resourceVersion")) if isinstance(meta, dict)
                           else (None, None, None)))
    assert head == (parts if all(isinstance(p, str) for p in parts) else None)


@settings(max_examples=400, deadline=None)
@given(line=st.binary(max_size=64) | value.map(lambda v: json.dumps(v).encode()))
def test_any_lines_head_is_four_strings_or_nothing_and_never_raises(line):
    head = event_head(line)
    assert head is None or (len(head) == 4 and all(isinstance(p, str) for p in head))


def test_hostile_lines_are_refused_not_raised():
    deep = b'{"type":"ADDED","object":{"metadata":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    for line in (deep, b'{"type":"ADDED","object":{"status":1e999}}', b'{"type":"ADDED","object":{"a":"\\ud800"}}',
                 b"\xff\xfe", b'{"type":"ADDED","object":{'):
        assert loads_event(line, status_only=True) is None
        assert event_head(line) is None
