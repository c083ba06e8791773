"""Start-up checks: the config, the CEL rules, the label tokens (tokenizer.json and /tokenize)."""

from __future__ import annotations

import asyncio
import json

import pytest
from arbiter_devenv.vllm_standin import StandinServer, write_model_dir
from arbiter_runtime.config import ConfigError, load_config, parse_config
from arbiter_runtime.fallback import RulesEngine
from arbiter_runtime.server import create_app
from arbiter_runtime.service import RuntimeOptions
from arbiter_runtime.tokens import TokenizerJsonSource, TokenizerRefused, UpstreamTokenizeSource, resolve
from arbiter_runtime.upstream import UpstreamClient
from support.polling import eventually
from support.runtime_helpers import CODES, LABELS, base_config

URL = "http://127.0.0.1:1/v1"


@pytest.mark.parametrize("change, message", [
    ({"labels": "approve"}, "labels: must be a non-empty list"),
    ({"labels": ["approve"]}, "at least two labels"),
    ({"labels": ["ok:no", "x"]}, "labels[0]"),
    ({"labels": ["a", "a"]}, "duplicate"),
    ({"steps": 0}, "steps"),
    ({"steps": "2"}, "steps"),
    ({"trajectoryMode": "free"}, "trajectoryMode"),
    ({"diffusion": True, "trajectoryMode": "scored"}, "diffusion"),
    ({"confidenceThreshold": 2}, "confidenceThreshold"),
    ({"lowConfidencePolicy": "ignore"}, "lowConfidencePolicy"),
    ({"inputSchema": {"type": "nonsense"}}, "inputSchema"),
    ({"fallbackRules": [{"name": "x", "when": "true", "decision": "maybe", "reasoningCode": "thin_file"}]},
     "fallbackRules[0].decision"),
    ({"fallbackRules": [{"name": "x", "when": "true", "decision": "deny", "reasoningCode": "nope"}]},
     "fallbackRules[0].reasoningCode"),
    ({"upstream": {"url": "ftp://x"}}, "upstream.url"),
    ({"sla": {"p95LatencyMs": -1}}, "sla.p95LatencyMs"),
    ({"surprise": 1}, "unknown keys ['surprise']"),
])
def test_config_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as err:
        parse_config(base_config(URL, **change))
    assert message in str(err.value)


def test_defaults_and_file_loading(tmp_path, monkeypatch):
    raw = base_config(URL)
    for key in ("trajectoryMode", "lowConfidencePolicy", "outputSchema", "sla", "diffusion", "upstream"):
        raw.pop(key)
    path = tmp_path / "decision.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setenv("ARBITER_DECISION_CONFIG", str(path))
    cfg = load_config()
    assert cfg.trajectory_mode == "scored" and cfg.low_confidence_policy == "flag"
    assert cfg.upstream.url == "http://127.0.0.1:8000/v1" and cfg.upstream.served_model_name == "credit"
    path.write_text("{broken")
    with pytest.raises(ConfigError, match="not JSON: line 1"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_invalid_cel_stops_start_up():
    rules = [{"name": "bad", "when": "input.amount >", "decision": "deny", "reasoningCode": "debt_high"}]
    with pytest.raises(ConfigError, match=r"fallbackRules\[0\] \(bad\).when is not valid CEL"):
        create_app(parse_config(base_config(URL, fallbackRules=rules)))


def test_rules_are_cel_evaluated_in_order_never_python():
    cfg = parse_config(base_config(URL, fallbackRules=[
        {"name": "nested", "when": "has(input.applicant) && input.applicant.age < 21.0", "decision": "deny",
         "reasoningCode": "thin_file"},
        {"name": "eu", "when": "input.country in ['DE', 'FR'] && input.amount <= 5000.0", "decision": "approve",
         "reasoningCode": "income_ok"},
        {"name": "default", "when": "true", "decision": "review", "reasoningCode": "thin_file"},
    ]))
    engine = RulesEngine(cfg.fallback_rules)
    assert engine.decide({"amount": 100, "country": "DE"}).rule == "eu"
    assert engine.decide({"amount": 100.0, "country": "DE"}).rule == "eu"  # 100 and 100.0 decide alike
    assert engine.decide({"amount": 100, "country": "DE", "applicant": {"age": 19}}).rule == "nested"
    assert engine.decide({"amount": 9000, "country": "DE"}).rule == "default"
    # A Python expression is not run: CEL has no such function, so the rule does not match.
    py = RulesEngine(parse_config(base_config(URL, fallbackRules=[
        {"name": "py", "when": "__import__('os').system('touch /tmp/arbiter-pwned') == 0", "decision": "deny",
         "reasoningCode": "debt_high"},
        {"name": "default", "when": "true", "decision": "review", "reasoningCode": "thin_file"}])).fallback_rules)
    assert py.decide({"amount": 1, "country": "DE"}).rule == "default" and py.eval_errors == 1


def test_a_rule_that_fails_on_an_input_is_skipped():
    engine = RulesEngine(parse_config(base_config(URL)).fallback_rules)
    decided = engine.decide({"country": "DE"})  # no amount: rule 1 cannot be evaluated
    assert decided.rule == "default" and engine.eval_errors == 1


def test_label_tokens_from_tokenizer_json(tmp_path):
    model = write_model_dir(tmp_path / "model", words=LABELS)
    tokens = asyncio.run(resolve(TokenizerJsonSource(model), tuple(LABELS), tuple(CODES)))
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab()
    assert tokens.label_ids == {x: vocab[x] for x in LABELS}
    assert len(set(tokens.label_ids.values())) == 3


def test_a_model_whose_labels_are_not_single_tokens_is_refused(tmp_path, standin):
    model = write_model_dir(tmp_path / "model", words=["approve"])  # "deny", "review" are several tokens
    with pytest.raises(TokenizerRefused) as err:
        asyncio.run(resolve(TokenizerJsonSource(model), tuple(LABELS), tuple(CODES)))
    assert "'deny'" in str(err.value) and "trajectoryMode: generated" in str(err.value)

    async def via_upstream():
        client = UpstreamClient()
        await client.start()
        try:
            source = UpstreamTokenizeSource(client, standin.url, "credit-v1")
            await resolve(source, ("approve", "maybe"), tuple(CODES))
        finally:
            await client.close()

    with pytest.raises(TokenizerRefused, match="'maybe'"):
        asyncio.run(via_upstream())


def test_labels_sharing_a_token_are_refused():
    class Tok:  # a tokenizer whose vocabulary folds case
        async def encode(self, text):
            return [ord(c) for c in text.lower()]

    with pytest.raises(TokenizerRefused, match="same token"):
        asyncio.run(resolve(Tok(), ("A", "a"), ("ok",)))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn's exit(3)
def test_server_refuses_the_model_at_start_up(tmp_path, make_runtime):
    upstream = StandinServer(words=["approve"], served_model_name="credit-v1").start()
    try:
        fatal = []
        server = make_runtime(base_config(upstream.url), RuntimeOptions(on_fatal=fatal.append), wait_ready=False)
        eventually(lambda: fatal, 30, "the fatal callback", interval=0.02)
        assert fatal and "'deny'" in fatal[0]
        with server.client() as c:
            r = c.get("/v2/health/ready")
        assert r.status_code == 503 and "cannot run in scored mode" in r.json()["error"]
        # With a model directory the refusal happens before the server listens.
        model = write_model_dir(tmp_path / "m", words=["approve"])
        with pytest.raises(RuntimeError):
            make_runtime(base_config(upstream.url), RuntimeOptions(model_dir=str(model)))
    finally:
        upstream.stop()


def test_start_from_a_model_directory_without_tokenize(tmp_path, make_runtime, standin):
    model = write_model_dir(tmp_path / "model", words=LABELS)
    server = make_runtime(base_config(standin.url), RuntimeOptions(model_dir=str(model)))
    with server.client() as c:
        assert c.post("/v1/decisions", json={"amount": 1, "country": "DE"}).json()["source"] == "model"


def test_rules_see_the_model_result_and_the_reason():
    engine = RulesEngine(parse_config(base_config(URL, fallbackRules=[
        {"name": "keep-model", "when": "has(model.decision) && model.confidence > 0.3", "decision": "approve",
         "reasoningCode": "income_ok"},
        {"name": "late", "when": "reason == 'deadline'", "decision": "review", "reasoningCode": "thin_file"},
        {"name": "default", "when": "true", "decision": "deny", "reasoningCode": "debt_high"}])).fallback_rules)
    doc = {"amount": 1, "country": "DE"}
    assert engine.decide(doc, {"decision": "deny", "confidence": 0.4, "trajectory": {}}, "low_confidence").rule == \
        "keep-model"
    assert engine.decide(doc, None, "deadline").rule == "late"
    assert engine.decide(doc, None, "upstream_down").rule == "default"


def test_cli_refuses_a_bad_config_and_a_bad_model_with_clear_exit_codes(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "decision.json"
    cfg.write_text(json.dumps(base_config(URL, labels=["approve"])))
    proc = subprocess.run([sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "labels: at least two labels" in proc.stderr
    cfg.write_text(json.dumps(base_config(URL)))
    model = write_model_dir(tmp_path / "model", words=["approve"])
    proc = subprocess.run([sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(cfg),
                           "--model-dir", str(model)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "label 'deny'" in proc.stderr and "Traceback" not in proc.stderr
