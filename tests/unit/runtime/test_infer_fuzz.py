"""Property-based fuzzing of the infer endpoint: malformed bodies never cause a 500, and nothing hangs."""

from __future__ import annotations

import json

import httpx
import pytest
from arbiter_devenv.vllm_standin import StandinServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.runtime_helpers import LABELS, RuntimeServer, base_config

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

documents = st.fixed_dictionaries(
    {}, optional={"amount": json_values | st.floats(min_value=0, max_value=1e6), "country": st.text(max_size=3),
                  "applicant": json_values, "extra": json_values})

tensors = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.just("input"), json_values),
    "shape": st.one_of(st.lists(st.integers(min_value=-2, max_value=4), max_size=3), json_values),
    "datatype": st.sampled_from(["BYTES", "FP32", "INT64", "", None]),
    "data": st.one_of(st.lists(st.one_of(documents.map(json.dumps), st.text(max_size=30), json_values), max_size=4),
                      json_values),
})

bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"inputs": st.one_of(st.lists(tensors, max_size=3), json_values),
                                        "id": json_values, "parameters": json_values,
                                        "outputs": st.one_of(st.lists(st.fixed_dictionaries(
                                            {"name": st.sampled_from(["decision", "trajectory", "x"])}), max_size=3),
                                            json_values)}),
)


@pytest.fixture(scope="module")
def fuzz_server():
    upstream = StandinServer(words=LABELS, served_model_name="credit-v1").start()
    server = RuntimeServer(base_config(upstream.url)).start()
    try:
        yield server
    finally:
        server.stop()
        upstream.stop()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=bodies, raw=st.one_of(st.none(), st.binary(max_size=64)),
       traceparent=st.one_of(st.none(), st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
                             .filter(lambda s: s == s.strip()),  # what an HTTP client can send
                             st.from_regex(r"\A[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")),
       path=st.sampled_from(["/v2/models/credit/infer", "/v2/models/credit/versions/v1/infer", "/v1/decisions",
                             "/v2/models/nope/infer"]))
def test_malformed_bodies_never_500(fuzz_server, body, raw, traceparent, path):
    content = raw if raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    with httpx.Client(base_url=fuzz_server.url, timeout=10) as c:
        r = c.post(path, content=content, headers=headers)
    assert r.status_code in (200, 400, 404, 503), (r.status_code, r.text)
    assert isinstance(r.json(), dict)
    if r.status_code != 200:
        assert isinstance(r.json()["error"], str) and r.json()["error"]


def test_server_still_serves_after_fuzzing(fuzz_server):
    with httpx.Client(base_url=fuzz_server.url, timeout=10) as c:
        assert c.get("/v2/health/ready").status_code == 200
        assert c.post("/v1/decisions", json={"amount": 1, "country": "DE"}).status_code == 200
