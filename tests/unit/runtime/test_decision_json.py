"""decision.json, the contract between the operator and the runtime (arbiter_runtime.contract): what the operator
renders for every example a user starts from is what the runtime starts with, and a hostile file gets the runtime's
error naming the key, never a crash."""

from __future__ import annotations

import json
import math
from datetime import UTC
from pathlib import Path

import pytest
from arbiter_operator.plan.validate import size_problems
from arbiter_operator.render import render_configmap
from arbiter_runtime.config import ConfigError, DecisionConfig, load_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.examples import EXAMPLES, example
from support.factory import make_dm
from support.runtime_helpers import base_config

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "decision.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", EXAMPLE_FILES)
@pytest.mark.parametrize("diffusion", [False, True])
def test_every_example_renders_a_decision_json_the_runtime_starts_with(tmp_path, name, diffusion):
    raw = example(name)
    if diffusion:  # a diffusion model is served in generated mode (the runtime refuses scored mode for it)
        raw["spec"]["decision"]["trajectoryMode"] = "generated"
    dm = make_dm(raw)
    assert dm.spec.versions, name
    for version in dm.spec.versions:
        text = render_configmap(dm, version, diffusion=diffusion)["data"]["decision.json"]
        cfg = load_config(_write(tmp_path, text))
        decision = dm.spec.decision
        assert (cfg.model, cfg.version, cfg.diffusion) == (dm.spec.model.name, version.name, diffusion)
        assert list(cfg.labels) == ((version.decision and version.decision.labels) or decision.labels)
        assert cfg.sla_p95_latency_ms == version.metadata.sla.p95LatencyMs
        assert cfg.input_schema == version.metadata.inputSchema
        assert [r.name for r in cfg.fallback_rules] == [r.name for r in decision.fallbackRules]
        assert cfg.upstream.url == "http://127.0.0.1:8000/v1"


def test_a_version_override_the_runtime_would_refuse_is_reported_before_anything_is_rendered():
    raw = example()
    rule_label = raw["spec"]["decision"]["fallbackRules"][0]["decision"]
    kept = [x for x in raw["spec"]["decision"]["labels"] if x != rule_label]
    raw["spec"]["versions"][0]["decision"] = {"labels": kept}  # the rule now decides a label the version lacks
    dm = make_dm(raw)
    problems = size_problems(dm)
    assert len(problems) == 1, problems
    assert f"spec.versions[{dm.spec.versions[0].name}]" in problems[0]
    assert f"fallbackRules[0].decision: {rule_label!r} is not one of labels {kept}" in problems[0]


# ---------------------------------------------------------------- hostile files

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
VALID = base_config("http://127.0.0.1:1/v1")
KEYS = [*sorted(VALID), "probabilityTolerance", "scoredFormat", "instructions", "diffusion", "surprise"]


@st.composite
def hostile_configs(draw: st.DrawFn) -> object:
    """A valid config with keys replaced by, added as or removed for arbitrary JSON, nested ones too; or any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    cfg = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        action = draw(st.sampled_from(["replace", "drop", "nested"]))
        if action == "drop":
            cfg.pop(key, None)
        elif action == "nested" and isinstance(cfg.get(key), dict):
            cfg[key][draw(st.sampled_from(["url", "maxRetries", "p95LatencyMs", "type", "x"]))] = draw(JSON)
        elif action == "nested" and isinstance(cfg.get(key), list) and cfg[key]:
            i = draw(st.integers(0, len(cfg[key]) - 1))
            item = cfg[key][i]
            if isinstance(item, dict):
                item[draw(st.sampled_from(["name", "when", "decision", "reasoningCode", "x"]))] = draw(JSON)
            else:
                cfg[key][i] = draw(JSON)
        else:
            cfg[key] = draw(JSON)
    return cfg


def _loads_or_names_the_problem(path: Path) -> DecisionConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"decision config {path}"), message
        assert "\n" not in message and len(message) < 4000, message
        assert "Traceback" not in message and "pydantic" not in message.lower(), message
        return None


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=hostile_configs())
def test_a_hostile_decision_json_gets_an_error_naming_the_key_never_a_crash(tmp_path, raw):
    path = _write(tmp_path, json.dumps(raw))
    cfg = _loads_or_names_the_problem(path)
    if cfg is not None:  # accepted: the values are the ones the decision path trusts
        assert len(cfg.labels) >= 2 and len(set(cfg.labels)) == len(cfg.labels)
        assert 1 <= cfg.steps <= 32 and 1 <= cfg.deadline_ms <= 600_000
        assert 0.0 <= cfg.confidence_threshold <= 1.0 and not math.isnan(cfg.confidence_threshold)
        assert all(r.decision in cfg.labels and r.reasoning_code in cfg.reasoning_codes for r in cfg.fallback_rules)
        assert cfg.upstream.url.startswith(("http://", "https://"))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_a_file_that_is_not_json_gets_an_error_naming_the_file(tmp_path, blob):
    path = tmp_path / "decision.json"
    path.write_bytes(blob)
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc).startswith(f"decision config {path}") or str(exc).startswith("cannot read"), str(exc)
    except UnicodeDecodeError:
        pytest.fail("a file that is not UTF-8 must be refused with a ConfigError")


def test_the_refused_override_is_invalid_spec_and_nothing_is_rendered():
    from datetime import datetime

    from arbiter_operator.plan import Observations, plan

    raw = example()
    rule_label = raw["spec"]["decision"]["fallbackRules"][0]["decision"]
    raw["spec"]["versions"][0]["decision"] = {"labels": [x for x in raw["spec"]["decision"]["labels"]
                                                         if x != rule_label]}
    result = plan(make_dm(raw), Observations(), datetime.now(UTC))
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "the runtime would refuse its decision.json" in ready["message"]
    assert result.children is None  # what serves keeps serving: no child is touched
