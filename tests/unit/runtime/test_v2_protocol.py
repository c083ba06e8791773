"""The V2 endpoints and the plain JSON endpoint, as a caller sees them."""

from __future__ import annotations

import json
import math

from arbiter_devenv.vllm_standin import free_port
from support.runtime_helpers import LABELS, base_config, outputs, v2_body

CASE = {"amount": 1200, "country": "DE"}


def test_health_and_metadata(runtime):
    with runtime.client() as c:
        assert c.get("/v2/health/live").json() == {"live": True}
        assert c.get("/v2/health/ready").json() == {"ready": True}
        server = c.get("/v2").json()
        assert server["name"] == "arbiter-runtime" and "version" in server
        meta = c.get("/v2/models/credit").json()
        assert meta["name"] == "credit" and meta["versions"] == ["v1"]
        assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
        assert {o["name"]: o["datatype"] for o in meta["outputs"]}["confidence"] == "FP32"
        assert meta["parameters"]["labels"] == LABELS
        assert c.get("/v2/models/credit/versions/v1").status_code == 200
        assert c.get("/v2/models/credit/ready").json() == {"name": "credit", "ready": True}
        assert c.get("/v2/models/credit/versions/v1/ready").status_code == 200


def test_infer_batch_returns_one_explained_decision_per_row(runtime):
    rows = [CASE, {"amount": 50, "country": "US"}, {"amount": 9000, "country": "FR"}]
    trace = "0af7651916cd43dd8448eb211c80319c"
    with runtime.client() as c:
        r = c.post("/v2/models/credit/infer", json=v2_body(*rows, id="req-1"),
                   headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == "credit" and body["model_version"] == "v1" and body["id"] == "req-1"
    assert body["parameters"]["trace_id"] == trace
    assert r.headers["traceparent"].startswith(f"00-{trace}-")
    out = outputs(body)
    assert out["decision"]["datatype"] == "BYTES" and out["decision"]["shape"] == [3]
    assert out["confidence"]["datatype"] == "FP32"
    assert out["source"]["data"] == ["model"] * 3
    for decision, confidence, trajectory in zip(out["decision"]["data"], out["confidence"]["data"],
                                                out["trajectory"]["data"], strict=True):
        t = json.loads(trajectory)  # a UTF-8 string holding the JSON trajectory, not base64
        assert [s["step"] for s in t["steps"]] == [1, 2]
        last = t["steps"][-1]["probabilities"]
        assert math.isclose(sum(last.values()), 1.0, abs_tol=1e-9)
        assert decision == max(LABELS, key=lambda x: last[x])
        assert confidence == last[decision]


def test_requested_outputs_and_versioned_infer(runtime):
    with runtime.client() as c:
        r = c.post("/v2/models/credit/versions/v1/infer",
                   json=v2_body(CASE, outputs=[{"name": "decision"}, {"name": "confidence"}]))
    assert r.status_code == 200
    assert [o["name"] for o in r.json()["outputs"]] == ["decision", "confidence"]


def test_plain_json_endpoint_shares_the_decision_path(runtime):
    with runtime.client() as c:
        plain = c.post("/v1/decisions", json=CASE).json()
        v2 = outputs(c.post("/v2/models/credit/infer", json=v2_body(CASE)).json())
    assert plain["decision"] == v2["decision"]["data"][0]
    assert plain["trajectory"] == json.loads(v2["trajectory"]["data"][0])  # same input, same seed, same answer
    assert plain["source"] == "model" and len(plain["traceId"]) == 32


def test_unknown_model_and_version_are_404(runtime):
    with runtime.client() as c:
        for method, path in [("GET", "/v2/models/other"), ("GET", "/v2/models/other/ready"),
                             ("POST", "/v2/models/other/infer"), ("GET", "/v2/models/credit/versions/v9"),
                             ("POST", "/v2/models/credit/versions/v9/infer"), ("GET", "/v2/nothing/here")]:
            r = c.request(method, path, json=v2_body(CASE))
            assert r.status_code == 404, path
            assert isinstance(r.json()["error"], str)


def test_bad_input_is_400_naming_the_field(runtime):
    cases = {
        "null amount": ({"amount": None, "country": "DE"}, "amount"),
        "string amount": ({"amount": "1200", "country": "DE"}, "amount"),  # never coerced
        "missing country": ({"amount": 5}, "country"),
        "nested": ({"amount": 5, "country": "DE", "applicant": {"age": "old"}}, "applicant.age"),
        "unknown field": ({"amount": 5, "country": "DE", "x": 1}, "x"),
    }
    with runtime.client() as c:
        for name, (doc, field) in cases.items():
            r = c.post("/v2/models/credit/infer", json=v2_body(doc))
            assert r.status_code == 400, name
            assert field in r.json()["error"], (name, r.json())
            r = c.post("/v1/decisions", json=doc)
            assert r.status_code == 400 and field in r.json()["error"], name
    assert runtime.runtime.metrics.decisions.labels("credit", "v1", "ok", "model")._value.get() == 0


def test_malformed_v2_bodies_are_400(runtime):
    bad = [
        b"not json",
        b"",
        json.dumps({"inputs": []}).encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [2], "datatype": "BYTES", "data": ["{}"]}]}).encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": ["{not json"]}]}).encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [5]}]}).encode(),
        json.dumps(v2_body(CASE, outputs=[{"name": "nope"}])).encode(),
        b'{"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": ["NaN"]}]}',
    ]
    with runtime.client() as c:
        for body in bad:
            r = c.post("/v2/models/credit/infer", content=body)
            assert r.status_code == 400, body
            assert r.json()["error"]


def test_a_bad_row_rejects_the_batch_before_any_token_is_spent(runtime, standin):
    before = len(standin.state.requests)
    with runtime.client() as c:
        r = c.post("/v2/models/credit/infer", json=v2_body(CASE, {"amount": -1, "country": "DE"}))
    assert r.status_code == 400 and "row 1" in r.json()["error"] and "amount" in r.json()["error"]
    assert len(standin.state.requests) == before


def test_not_ready_is_503_until_the_upstream_answers(make_runtime):
    port = free_port()  # nothing listens here yet
    server = make_runtime(base_config(f"http://127.0.0.1:{port}/v1"), wait_ready=False)
    with server.client() as c:
        r = c.get("/v2/health/ready")
        assert r.status_code == 503 and r.json()["ready"] is False and "upstream" in r.json()["error"]
        assert c.get("/v2/models/credit/ready").status_code == 503
        r = c.post("/v2/models/credit/infer", json=v2_body(CASE))
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        assert c.post("/v1/decisions", json=CASE).status_code == 503
        assert c.get("/v2/health/live").status_code == 200


def test_unready_is_200_ready_false_only_to_callers_that_ask_for_json(make_runtime):
    server = make_runtime(base_config(f"http://127.0.0.1:{free_port()}/v1"), wait_ready=False)
    with server.client() as c:
        for accept, status in [("*/*", 503), ("application/*", 503), ("text/plain, */*;q=0.8", 503),
                               ("application/json;q=0", 503), ("application/json", 200),
                               ("text/html, Application/JSON;q=0.5", 200)]:
            r = c.get("/v2/health/ready", headers={"accept": accept, "user-agent": "kube-probe/1.31"})
            assert r.status_code == status and r.json()["ready"] is False, accept
            assert r.headers["vary"] == "accept"
        # the model's readiness stays 503: both SDKs read it as False, and a 200 would be True to KServe's
        assert c.get("/v2/models/credit/ready", headers={"accept": "application/json"}).status_code == 503


def test_no_decision_at_all_is_503(standin, make_runtime):
    cfg = base_config(standin.url, fallbackRules=[
        {"name": "large-amount", "when": "input.amount > 10000.0", "decision": "deny", "reasoningCode": "debt_high"}])
    server = make_runtime(cfg)
    standin.set("failing")
    with server.client() as c:
        r = c.post("/v2/models/credit/infer", json=v2_body(CASE))
        assert r.status_code == 503 and "no fallback rule matched" in r.json()["error"]
        # ...but a case a rule covers is still decided
        r = c.post("/v1/decisions", json={"amount": 20000, "country": "DE"})
        assert r.status_code == 200 and r.json()["source"] == "rules"
    assert server.records()[0]["outcome"] == "error"


def test_wrong_method_is_a_v2_error(runtime):
    with runtime.client() as c:
        r = c.get("/v2/models/credit/infer")
        assert r.status_code == 405 and "error" in r.json()
