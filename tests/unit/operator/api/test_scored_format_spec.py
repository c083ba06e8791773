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
