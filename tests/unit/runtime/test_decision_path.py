"""Scored and generated modes, trajectory checks, retries, every fallback trigger, the confidence policy."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from arbiter_devenv.vllm_standin import StandinServer
from arbiter_runtime.config import parse_config
from arbiter_runtime.decide import ScoredMode, canonical_json, derive_seed
from arbiter_runtime.tokens import LabelTokens
from arbiter_runtime.trajectory import TrajectoryChecker, TrajectoryInvalid
from support.runtime_helpers import LABELS, base_config

CASE = {"amount": 1200, "country": "DE"}
EXAMPLE = json.loads((Path(__file__).parent / "data" / "scored-response-example.json").read_text())


def example_mode() -> ScoredMode:
    """The config the real vLLM 0.26 example answered: 3 steps of `ok:A|R` (the lines format)."""
    cfg = parse_config(base_config("http://127.0.0.1:1/v1", labels=["A", "R"], reasoningCodes=["ok"], steps=3,
                                   fallbackRules=[], scoredFormat="lines"))
    return ScoredMode(cfg, LabelTokens(label_ids={"A": 65, "R": 82}, code_ids={"ok": [1, 2]}, source="test"))


def test_scored_mode_reads_label_probabilities_from_a_real_vllm_response():
    trajectory = example_mode().parse(EXAMPLE)
    steps = trajectory["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and {s["reasoningCode"] for s in steps} == {"ok"}
    # step 1: R at -0.52193, A at -0.89986 -> normalised over the two labels
    r, a = math.exp(-0.5219309329986572), math.exp(-0.8998606204986572)
    assert steps[0]["probabilities"]["R"] == pytest.approx(r / (r + a))
    assert steps[0]["probabilities"]["A"] == pytest.approx(a / (r + a))
    assert steps[0]["confidence"] == pytest.approx(r / (r + a))
    assert all(s["label"] == "R" for s in steps)
    cfg = example_mode().cfg
    TrajectoryChecker(cfg).check(trajectory)  # matches the derived output schema by construction
    assert TrajectoryChecker(cfg).decide(trajectory)[0] == "R"


@pytest.mark.parametrize("mutate, kind", [
    # cut at max_tokens: two of the three lines
    (lambda r: r["choices"][0].update(finish_reason="length", message={**r["choices"][0]["message"],
                                                                       "content": "ok:R\nok:R\n"}), "length"),
    (lambda r: r["choices"][0]["message"].update(content="ok:R\nok:X\nok:R\n"), "format"),
    (lambda r: r["choices"][0]["message"].update(content="ok:R\nok:R\n"), "format"),
    (lambda r: r["choices"][0].update(logprobs=None), "logprobs"),
    # logprob_token_ids not honoured (an upstream that ignores the field): only the sampled token comes back
    (lambda r: [e.update(top_logprobs=e["top_logprobs"][:1]) for e in r["choices"][0]["logprobs"]["content"]],
     "logprobs"),
    # every label masked where the label is written
    (lambda r: [t.update(logprob=-9999.0) for t in r["choices"][0]["logprobs"]["content"][3]["top_logprobs"]],
     "logprobs"),
    (lambda r: r.update(choices=[]), "protocol"),
])
def test_scored_answers_that_cannot_be_trusted_are_rejected(mutate, kind):
    response = copy.deepcopy(EXAMPLE)
    mutate(response)
    with pytest.raises(TrajectoryInvalid) as err:
        example_mode().parse(response)
    assert err.value.kind == kind


def _traj(*steps):
    return {"steps": [{"step": n, "reasoningCode": "income_ok", "probabilities": p, "confidence": max(p.values())}
                      for n, p in steps]}


@pytest.mark.parametrize("trajectory, kind", [
    (_traj((1, {"approve": 0.7, "deny": 0.2, "review": 0.3}), (2, {"approve": 1.0, "deny": 0.0, "review": 0.0})),
     "probabilities"),
    (_traj((2, {"approve": 0.5, "deny": 0.5, "review": 0.0}), (1, {"approve": 1.0, "deny": 0.0, "review": 0.0})),
     "order"),
    (_traj((1, {"approve": 1.5, "deny": -0.5, "review": 0.0}), (2, {"approve": 1.0, "deny": 0.0, "review": 0.0})),
     "schema"),
    (_traj((1, {"approve": 1.0, "deny": 0.0}), (2, {"approve": 1.0, "deny": 0.0, "review": 0.0})), "schema"),
    (_traj((1, {"approve": 1.0, "deny": 0.0, "review": 0.0})), "schema"),  # K=2 steps required
    ({"steps": "none"}, "schema"),
])
def test_trajectory_checks(trajectory, kind):
    checker = TrajectoryChecker(parse_config(base_config("http://127.0.0.1:1/v1")))
    with pytest.raises(TrajectoryInvalid) as err:
        checker.check(trajectory)
    assert err.value.kind == kind


def test_a_custom_output_schema_is_enforced_too():
    cfg = parse_config(base_config("http://127.0.0.1:1/v1", outputSchema={
        "type": "object", "properties": {"steps": {"items": {"properties": {"confidence": {"minimum": 0.9}}}}}}))
    good = _traj((1, {"approve": 0.5, "deny": 0.25, "review": 0.25}), (2, {"approve": 1.0, "deny": 0.0, "review": 0.0}))
    with pytest.raises(TrajectoryInvalid, match=r"steps\[0\].confidence"):
        TrajectoryChecker(cfg).check(good)


def test_scored_request_on_the_wire(runtime, standin):
    with runtime.client() as c:
        c.post("/v1/decisions", json=CASE).raise_for_status()
    req = standin.state.requests[-1]
    ids = standin.state.tokenizer.get_vocab()
    assert req["logprobs"] is True
    assert req["logprob_token_ids"] == [ids[x] for x in LABELS]
    assert "regex" in req["structured_outputs"] and "guided_json" not in req
    assert req["seed"] == derive_seed(runtime.runtime.cfg, canonical_json(CASE))
    assert req["temperature"] == 0.0 and req["model"] == "credit-v1"
    assert json.loads(req["messages"][-1]["content"]) == CASE


def test_same_input_same_answer_and_different_inputs_differ(runtime):
    with runtime.client() as c:
        a = c.post("/v1/decisions", json=CASE).json()
        b = c.post("/v1/decisions", json={"country": "DE", "amount": 1200}).json()  # same document, reordered
        others = [c.post("/v1/decisions", json={"amount": n, "country": "US"}).json()["trajectory"]
                  for n in range(5)]
    assert a["trajectory"] == b["trajectory"] and a["traceId"] != b["traceId"]
    assert len({json.dumps(t, sort_keys=True) for t in others}) > 1


def test_generated_mode_asks_for_a_json_schema_and_checks_the_answer(standin, make_runtime):
    server = make_runtime(base_config(standin.url, trajectoryMode="generated"))
    with server.client() as c:
        r = c.post("/v1/decisions", json=CASE).json()
    req = standin.state.requests[-1]
    assert set(req["structured_outputs"]) == {"json"} and "seed" in req and "guided_json" not in req
    assert r["source"] == "model" and len(r["trajectory"]["steps"]) == 2


def test_diffusion_models_get_no_constraint_and_no_seed_and_are_retried_when_invalid(make_runtime):
    upstream = StandinServer(words=LABELS, served_model_name="credit-v1", reject_structured=True).start()
    try:
        server = make_runtime(base_config(upstream.url, trajectoryMode="generated", diffusion=True))
        upstream.set("invalid", count=1)
        with server.client() as c:
            r = c.post("/v1/decisions", json=CASE).json()
        req = upstream.state.requests[-1]
        assert "structured_outputs" not in req and "seed" not in req and "temperature" not in req
        assert r["source"] == "model"
        assert server.records()[-1]["attempts"] == 2
        assert server.runtime.metrics.schema_violations.labels("credit", "v1", "probabilities")._value.get() == 1
    finally:
        upstream.stop()


def test_transient_upstream_failure_is_retried(runtime, standin):
    standin.set("failing", count=2)
    with runtime.client() as c:
        r = c.post("/v1/decisions", json=CASE).json()
    assert r["source"] == "model"
    assert runtime.records()[-1]["attempts"] == 3
    assert runtime.runtime.metrics.upstream_errors.labels("credit", "v1", "http_5xx")._value.get() == 2


def _fallback(runtime, reason: str, document=CASE):
    with runtime.client() as c:
        r = c.post("/v1/decisions", json=document)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["source"] == "rules" and body["fallbackReason"] == reason, body
    assert runtime.runtime.metrics.fallbacks.labels("credit", "v1", reason)._value.get() >= 1
    return body


def test_fallback_when_the_upstream_keeps_failing(runtime, standin):
    standin.set("failing")
    body = _fallback(runtime, "upstream_error")
    assert body["decision"] == "review" and body["trajectory"]["rule"] == "default"
    assert len(standin.state.requests) >= 3  # 1 + maxRetries attempts


def test_fallback_when_the_upstream_is_down(runtime, standin):
    standin.stop()
    body = _fallback(runtime, "upstream_down", {"amount": 20000, "country": "DE"})
    assert body["decision"] == "deny" and body["trajectory"]["rule"] == "large-amount"


def test_fallback_when_the_upstream_is_slower_than_the_deadline(standin, make_runtime):
    server = make_runtime(base_config(standin.url, deadlineMs=200))
    standin.set("slow", delay_s=1.0)
    _fallback(server, "deadline")


@pytest.mark.parametrize("mode", ["invalid", "truncated"])
def test_fallback_when_the_answer_stays_invalid(runtime, standin, mode):
    standin.set(mode)
    body = _fallback(runtime, "invalid")
    record = runtime.records()[-1]
    assert record["attempts"] == 3 and record["source"] == "rules"
    kind = "format" if mode == "invalid" else "length"
    assert runtime.runtime.metrics.schema_violations.labels("credit", "v1", kind)._value.get() == 3
    assert body["trajectory"]["fallbackReason"] == "invalid"


def test_truncated_generated_answer_is_a_failure_never_parsed_leniently(standin, make_runtime):
    server = make_runtime(base_config(standin.url, trajectoryMode="generated"))
    standin.set("truncated")
    _fallback(server, "invalid")
    assert server.runtime.metrics.schema_violations.labels("credit", "v1", "length")._value.get() == 3


UNSURE = {"approve": 0.40, "deny": 0.35, "review": 0.25}


def test_low_confidence_is_flagged_under_the_flag_policy(runtime, standin):
    standin.set("valid", distribution=UNSURE)
    with runtime.client() as c:
        body = c.post("/v1/decisions", json=CASE).json()
    assert body["source"] == "model" and body["lowConfidence"] is True and body["decision"] == "approve"
    assert body["confidence"] == pytest.approx(0.40)
    assert runtime.records()[-1]["outcome"] == "low_confidence"


def test_low_confidence_goes_to_the_rules_under_the_fallback_policy(standin, make_runtime):
    server = make_runtime(base_config(standin.url, lowConfidencePolicy="fallback"))
    standin.set("valid", distribution=UNSURE)
    body = _fallback(server, "low_confidence")
    assert body["decision"] == "review" and body["trajectory"]["modelTrajectory"]["steps"]
    standin.set("valid", distribution={"approve": 0.9, "deny": 0.05, "review": 0.05})
    with server.client() as c:
        sure = c.post("/v1/decisions", json={"amount": 3, "country": "US"}).json()
    assert sure["source"] == "model" and sure["decision"] == "approve" and sure["lowConfidence"] is False


def test_low_confidence_without_a_matching_rule_keeps_the_flagged_model_decision(standin, make_runtime):
    server = make_runtime(base_config(standin.url, lowConfidencePolicy="fallback", fallbackRules=[]))
    standin.set("valid", distribution=UNSURE)
    with server.client() as c:
        body = c.post("/v1/decisions", json=CASE).json()
    assert body["source"] == "model" and body["lowConfidence"] is True and body["fallbackReason"] == "low_confidence"


def test_label_tokens_are_matched_by_bytes_when_the_token_text_differs():
    response = copy.deepcopy(EXAMPLE)
    for entry in response["choices"][0]["logprobs"]["content"]:
        for alt in entry["top_logprobs"]:
            alt["token"] = "\u2581" + alt["token"]  # vocabulary form, bytes unchanged
    assert example_mode().parse(response) == example_mode().parse(EXAMPLE)


def test_standin_answers_in_the_shape_real_vllm_does(standin):
    import httpx

    ids = standin.state.tokenizer.get_vocab()
    body = {"model": "credit-v1", "messages": [{"role": "user", "content": "x"}], "temperature": 0, "seed": 7,
            "logprobs": True, "logprob_token_ids": [ids["approve"], ids["deny"]],
            "structured_outputs": {"regex": "(ok|no):(approve|deny)\\n(ok|no):(approve|deny)\\n"}}
    ours = httpx.post(standin.url + "/chat/completions", json=body, timeout=30).json()
    real = EXAMPLE
    assert set(ours) == set(real)
    assert set(ours["choices"][0]) == set(real["choices"][0])
    assert set(ours["choices"][0]["message"]) == set(real["choices"][0]["message"])
    entries = ours["choices"][0]["logprobs"]["content"]
    assert set(entries[0]) == set(real["choices"][0]["logprobs"]["content"][0])
    assert entries[-1]["token"] == "<eos>" and ours["choices"][0]["finish_reason"] == "stop"
    # the sampled token first, then the requested ids; where the regex forbids a label it reads -9999.0
    first = entries[0]["top_logprobs"]
    assert first[0]["token"] == entries[0]["token"] and {t["token"] for t in first[1:]} == {"approve", "deny"}
    assert all(t["logprob"] == -9999.0 for t in first[1:])
    content = ours["choices"][0]["message"]["content"]
    assert content.count("\n") == 2 and len(entries) == ours["usage"]["completion_tokens"]
    # max_tokens cuts the answer: finish_reason length
    short = httpx.post(standin.url + "/chat/completions", json=dict(body, max_tokens=2), timeout=30).json()
    assert short["choices"][0]["finish_reason"] == "length"
    # guided_json is not a field vLLM 0.26 reads: it changes nothing
    plain = dict(body, guided_json={"type": "object"})
    assert httpx.post(standin.url + "/chat/completions", json=plain, timeout=30).json()["choices"][0]["message"][
        "content"] == content
