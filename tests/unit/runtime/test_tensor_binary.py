"""The binary tensor data extension: what KServe's and Triton's clients encode is read back exactly, what the server
encodes their decoders read back exactly, and a hostile framing is a 400 naming the number that does not fit."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
from arbiter_runtime.protocol import BadRequest
from arbiter_runtime.tensor_binary import attach_inputs, encode_outputs, split_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kserve.protocol.infer_type import InferResponse
from support.runtime_helpers import outputs
from tritonclient.http import InferResult
from tritonclient.utils import serialize_byte_tensor

CASE = {"amount": 1200, "country": "DE"}
texts = st.text(max_size=40)
documents = st.dictionaries(st.text(max_size=8), st.one_of(texts, st.integers(-10**6, 10**6), st.booleans()),
                            max_size=4).map(json.dumps)


def framed(docs: list[bytes], **tensor_extra) -> tuple[bytes, dict[str, str]]:
    """A request as tritonclient frames one: JSON header, then the BYTES tensor serialised by tritonclient."""
    raw = serialize_byte_tensor(np.array(docs, dtype=np.object_)).item() if docs else b""
    tensor = {"name": "input", "shape": [len(docs)], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    tensor.update(tensor_extra)
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + raw, {"inference-header-content-length": str(len(head))}


@settings(max_examples=200, deadline=None)
@given(st.lists(documents, min_size=1, max_size=8))
def test_what_tritonclient_serialises_is_read_back_exactly(docs):
    body, headers = framed([d.encode() for d in docs])
    head, binary = split_body(body, headers["inference-header-content-length"])
    tensor = attach_inputs(json.loads(head), binary)["inputs"][0]
    assert tensor["data"] == docs


@settings(max_examples=300, deadline=None)
@given(head_len=st.one_of(st.integers(-5, 400).map(str), st.text(max_size=6)),
       size=st.one_of(st.integers(-(2**40), 2**40), st.booleans(), st.floats(), st.text(max_size=4), st.none()),
       binary=st.binary(max_size=64), with_data=st.booleans(),
       datatype=st.sampled_from(["BYTES", "FP32", None]))
def test_hostile_framing_is_a_400_never_another_error(head_len, size, binary, with_data, datatype):
    tensor = {"name": "input", "shape": [1], "datatype": datatype, "parameters": {"binary_data_size": size}}
    if with_data:
        tensor["data"] = [json.dumps(CASE)]
    body = json.dumps({"inputs": [tensor]}).encode() + binary
    try:
        head, tail = split_body(body, head_len)
        attach_inputs(json.loads(head), tail)
    except (BadRequest, json.JSONDecodeError, UnicodeDecodeError):  # a header cut inside the JSON: 400 as well
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_tensor_decodes_or_names_the_element(raw):
    tensor = {"name": "input", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    try:
        elements = attach_inputs({"inputs": [tensor]}, raw)["inputs"][0]["data"]
    except BadRequest as exc:
        assert "element" in str(exc) or "rows" in str(exc)
        return
    assert b"".join(struct.pack("<I", len(e.encode())) + e.encode() for e in elements) == raw


columns = st.integers(min_value=0, max_value=6).flatmap(lambda n: st.fixed_dictionaries({
    "decision": st.lists(texts, min_size=n, max_size=n),
    "confidence": st.lists(st.floats(0, 1, width=32), min_size=n, max_size=n),
    "low_confidence": st.lists(st.booleans(), min_size=n, max_size=n),
}))


@settings(max_examples=200, deadline=None)
@given(columns, st.sets(st.sampled_from(["decision", "confidence", "low_confidence"])))
def test_binary_outputs_read_back_exactly_by_both_sdks(cols, binary):
    types = {"decision": "BYTES", "confidence": "FP32", "low_confidence": "BOOL"}
    n = len(cols["decision"])
    body = {"model_name": "credit", "model_version": "v1", "id": "r", "outputs": [
        {"name": k, "datatype": types[k], "shape": [n], "data": list(v)} for k, v in cols.items()]}
    content, head = encode_outputs(json.loads(json.dumps(body)), frozenset(binary))
    triton = InferResult.from_response_body(content, header_length=head)
    kserve = {o.name: o.as_numpy() for o in InferResponse.from_bytes(content, head).outputs}
    for name, values in cols.items():
        as_text = [v.decode() if isinstance(v, bytes) else v for v in triton.as_numpy(name)]
        assert as_text == values, f"tritonclient read {name} as {as_text}"
        as_text = [v.decode() if isinstance(v, bytes) else v for v in kserve[name]]
        assert as_text == values, f"kserve read {name} as {as_text}"


HOSTILE = [  # (how the framing lies, what the 400 names)
    (lambda b, h: (b, {**h, "inference-header-content-length": str(len(b) + 1)}), "past the end|has only"),
    (lambda b, h: (b, {**h, "inference-header-content-length": "-4"}), "non-negative integer"),
    (lambda b, h: (b, {**h, "inference-header-content-length": "0x20"}), "non-negative integer"),
    (lambda b, h: (b, {**h, "inference-header-content-length": "0"}), "no JSON header"),
    (lambda b, h: (b + b"extra", h), "add up to"),
    (lambda b, h: (b[:-3], h), "past the end of the body"),
]


@pytest.mark.parametrize("lie,named", HOSTILE)
def test_a_lying_framing_is_400_naming_it(runtime, lie, named):
    body, headers = lie(*framed([json.dumps(CASE).encode()]))
    with runtime.client() as c:
        r = c.post("/v2/models/credit/infer", content=body, headers={"content-type": "application/octet-stream",
                                                                      **headers})
    assert r.status_code == 400, r.text
    assert any(n in r.json()["error"] for n in named.split("|")), r.json()["error"]


@pytest.mark.parametrize("raw,named", [
    (struct.pack("<I", 1000) + b"{}", "element 0 says 1000 bytes, but the tensor has only 2"),
    (b"\x02\x00", "element 0: the 4-byte length is cut off"),
    (struct.pack("<I", 2) + b"{}" + struct.pack("<I", 9), "element 1 says 9 bytes"),
    (struct.pack("<I", 8) + '{"a":1}'.encode("utf-16-le")[:8], "element 0 is UTF-16-LE, not UTF-8"),
    (struct.pack("<I", 2) + b"\xff\xfe", "element 0 is UTF-16, not UTF-8"),
    (struct.pack("<I", 3) + b"{\xc3}", "element 0 is not UTF-8"),
])
def test_a_bytes_element_that_does_not_fit_is_400_naming_it(runtime, raw, named):
    tensor = {"name": "input", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    head = json.dumps({"inputs": [tensor]}).encode()
    with runtime.client() as c:
        r = c.post("/v2/models/credit/infer", content=head + raw,
                   headers={"inference-header-content-length": str(len(head))})
    assert r.status_code == 400 and named in r.json()["error"], r.text


def test_framing_problems_outside_the_tensor_are_named(runtime):
    body, headers = framed([json.dumps(CASE).encode()], data=[json.dumps(CASE)])
    with runtime.client() as c:
        both = c.post("/v2/models/credit/infer", content=body, headers=headers)
        lying, lying_headers = framed([b"{}"], parameters={"binary_data_size": -1})
        negative = c.post("/v2/models/credit/infer", content=lying, headers=lying_headers)
        octet = c.post("/v2/models/credit/infer", content=json.dumps(CASE).encode(),
                       headers={"content-type": "application/octet-stream"})
        plain = c.post("/v1/decisions", content=body, headers=headers)
    assert both.status_code == 400 and "both 'data' and parameters.binary_data_size" in both.json()["error"]
    assert negative.status_code == 400 and "non-negative" in negative.json()["error"]
    assert octet.status_code == 415 and "inference-header-content-length" in octet.json()["error"]
    assert plain.status_code == 400 and "only read by the V2 infer" in plain.json()["error"]


def test_binary_in_json_out_and_binary_out_agree_with_json(runtime):
    rows = [CASE, {"amount": 5, "country": "US"}]
    body, headers = framed([json.dumps(d).encode() for d in rows])
    split = int(headers["inference-header-content-length"])
    head, raw = json.loads(body[:split]), body[split:]
    head["parameters"] = {"binary_data_output": True}
    head["outputs"] = [{"name": "decision"}, {"name": "confidence", "parameters": {"binary_data": False}}]
    asking = json.dumps(head).encode()
    with runtime.client() as c:
        as_json = c.post("/v2/models/credit/infer", json={"inputs": [{
            "name": "input", "shape": [2], "datatype": "BYTES", "data": [json.dumps(d) for d in rows]}]})
        binary_in = c.post("/v2/models/credit/infer", content=body, headers=headers)
        binary_out = c.post("/v2/models/credit/infer", content=asking + raw,
                            headers={"inference-header-content-length": str(len(asking))})
    assert as_json.status_code == binary_in.status_code == binary_out.status_code == 200
    assert "inference-header-content-length" not in binary_in.headers  # no binary asked for: JSON as before
    assert outputs(binary_in.json())["decision"]["data"] == outputs(as_json.json())["decision"]["data"]
    length = int(binary_out.headers["inference-header-content-length"])
    assert binary_out.headers["content-type"] == "application/octet-stream"
    result = InferResult.from_response_body(binary_out.content, header_length=length)
    meta = {o["name"]: o for o in result.get_response()["outputs"]}
    assert "data" not in meta["decision"] and meta["decision"]["parameters"]["binary_data_size"] > 0
    assert "data" in meta["confidence"]  # its own binary_data: false wins over the request's binary_data_output
    assert [d.decode() for d in result.as_numpy("decision")] == outputs(as_json.json())["decision"]["data"]
    assert binary_out.headers["traceparent"] and "total;dur=" in binary_out.headers["server-timing"]


@pytest.mark.parametrize("flag", [{"parameters": {"binary_data_output": "yes"}},
                                  {"outputs": [{"name": "decision", "parameters": {"binary_data": 1}}]},
                                  {"outputs": [{"name": "decision", "parameters": []}]}])
def test_binary_output_flags_that_are_not_booleans_are_400(runtime, flag):
    with runtime.client() as c:
        r = c.post("/v2/models/credit/infer", json={"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                                                "data": [json.dumps(CASE)]}], **flag})
    assert r.status_code == 400 and "must be" in r.json()["error"], r.text


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head_len=st.one_of(st.none(), st.integers(-3, 300).map(str)), tail=st.binary(max_size=40),
       size=st.one_of(st.integers(-3, 60), st.none()), coding=st.sampled_from([None, "gzip"]))
def test_framed_bodies_over_http_never_500(runtime, head_len, tail, size, coding):
    import gzip

    tensor = {"name": "input", "shape": [1], "datatype": "BYTES"}
    if size is not None:
        tensor["parameters"] = {"binary_data_size": size}
    body = json.dumps({"inputs": [tensor]}).encode() + tail
    headers = {} if head_len is None else {"inference-header-content-length": head_len}
    if coding:
        body, headers["content-encoding"] = gzip.compress(body), coding
    with httpx.Client(base_url=runtime.url, timeout=10) as c:
        r = c.post("/v2/models/credit/infer", content=body, headers=headers)
    assert r.status_code in (200, 400), (r.status_code, r.text)
    if r.status_code == 400:
        assert r.json()["error"]
