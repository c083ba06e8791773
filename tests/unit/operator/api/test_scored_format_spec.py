"""`spec.decision.scoredFormat`: rendered into decision.json (the runtime's contract), checked before anything runs."""

from __future__ import annotations

import json

import pydantic
import pytest
from arbiter_operator.plan.validate import operator_side_problems
from arbiter_operator.render.configmap import render_configmap
from arbiter_runtime.config import parse_config
from support.examples import example
from support.factory import make_dm


def _decision_json(raw) -> dict:
    dm = make_dm(raw)
    return json.loads(next(iter(render_configmap(dm, dm.spec.versions[0])["data"].values())))


def test_the_rendered_config_carries_the_format_and_the_runtime_accepts_it():
    raw = example()
    raw["spec"]["decision"].pop("scoredFormat", None)
    assert _decision_json(raw)["scoredFormat"] == "compact"  # the default
    raw["spec"]["decision"]["scoredFormat"] = "lines"
    cfg = _decision_json(raw)
    assert cfg["scoredFormat"] == "lines" and parse_config(cfg).label_joiner == ":"
    raw["spec"]["versions"][0]["decision"] = {"scoredFormat": "compact"}  # a version's override wins
    assert parse_config(_decision_json(raw)).scored_format == "compact"


def test_an_unknown_format_is_rejected_by_the_schema():
    raw = example()
    raw["spec"]["decision"]["scoredFormat"] = "csv"
    with pytest.raises(pydantic.ValidationError, match="scoredFormat"):
        make_dm(raw)


def test_names_the_compact_format_cannot_split_are_an_operator_side_problem_with_the_fix():
    raw = example()
    raw["spec"]["decision"]["reasoningCodes"].append("INCOME_OK_BUT_VOLATILE")
    problems = operator_side_problems(make_dm(raw).spec)
    assert any("'INCOME_OK' is the start of 'INCOME_OK_BUT_VOLATILE'" in p and "scoredFormat: lines" in p
               for p in problems), problems
    raw["spec"]["decision"]["scoredFormat"] = "lines"
    assert not operator_side_problems(make_dm(raw).spec)
    raw["spec"]["decision"].update(scoredFormat="compact", trajectoryMode="generated")
    assert not operator_side_problems(make_dm(raw).spec)


def test_the_fused_format_is_rendered_for_the_runtime_and_checked_like_compact():
    raw = example()
    raw["spec"]["decision"]["scoredFormat"] = "fused"
    cfg = parse_config(_decision_json(raw))
    assert cfg.scored_format == "fused" and cfg.label_joiner == ""
    # Its text has no separators either: a code that starts another cannot be read back.
    raw["spec"]["decision"]["reasoningCodes"].append("INCOME_OK_BUT_VOLATILE")
    problems = operator_side_problems(make_dm(raw).spec)
    assert any("'INCOME_OK' is the start of 'INCOME_OK_BUT_VOLATILE'" in p and "scoredFormat fused" in p
               for p in problems), problems


def test_a_fused_format_with_more_pairs_than_vllm_returns_is_refused_with_the_count():
    raw = example()
    labels = raw["spec"]["decision"]["labels"]
    raw["spec"]["decision"].update(scoredFormat="fused",
                                   reasoningCodes=[f"C{i:03d}X" for i in range(128 // len(labels) + 1)])
    pairs = len(raw["spec"]["decision"]["reasoningCodes"]) * len(labels)
    problems = operator_side_problems(make_dm(raw).spec)
    assert any(f"= {pairs} pair tokens" in p and "at most 128" in p for p in problems), problems
    raw["spec"]["decision"]["reasoningCodes"] = raw["spec"]["decision"]["reasoningCodes"][:128 // len(labels)]
    assert not operator_side_problems(make_dm(raw).spec)
    raw["spec"]["decision"]["scoredFormat"] = "compact"  # compact asks for the labels only
    raw["spec"]["decision"]["reasoningCodes"] = [f"C{i:03d}X" for i in range(200)]
    assert not operator_side_problems(make_dm(raw).spec)


def test_the_fast_example_canaries_a_fused_fp8_version_beside_a_compact_one():
    from arbiter_operator.render import vllm_args

    dm = make_dm(example("decisionmodel-fast.yaml"))
    assert not operator_side_problems(dm.spec)
    old, fast = dm.spec.versions
    formats = {v.name: json.loads(next(iter(render_configmap(dm, v)["data"].values())))["scoredFormat"]
               for v in (old, fast)}
    assert formats == {"1.0.0": "compact", "1.2.0": "fused"}
    assert "--quantization=fp8" in vllm_args(dm, fast) and not any("quantization" in a for a in vllm_args(dm, old))
