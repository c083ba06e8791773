"""An outputSchema that no trajectory of the version's decision settings can pass is refused with a condition naming
the clash; the shipped examples' schemas admit the runtime's trajectories (so they produce model decisions)."""

from __future__ import annotations

from datetime import UTC, datetime

import jsonschema
from arbiter_operator.plan import Observations, plan
from arbiter_operator.plan.output_schema import output_schema_clash, witnesses
from arbiter_operator.render import decision_config
from arbiter_runtime.config import parse_config
from arbiter_runtime.trajectory import TrajectoryChecker
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import example
from support.factory import make_dm

OLD_EXAMPLE = {"type": "object", "required": ["decision", "trajectory"],
               "properties": {"decision": {"type": "string"}, "trajectory": {"type": "array"}}}


def test_the_former_example_schema_is_refused_naming_what_it_asked_for():
    dm = make_dm()
    clash = output_schema_clash(OLD_EXAMPLE, dm.spec.decision)
    assert clash and "'decision' is a required property" in clash and '"steps"' in clash


def test_shipped_examples_admit_the_runtimes_trajectories():
    for name in ("decisionmodel.yaml", "decisionmodel-canary.yaml"):
        dm = make_dm(example(name))
        for version in dm.spec.versions:
            assert output_schema_clash(version.metadata.outputSchema, dm.spec.decision) is None, (name, version.name)
            # The runtime itself accepts a trajectory of these settings under the rendered decision.json.
            checker = TrajectoryChecker(parse_config(decision_config(dm, version)))
            checker.check(next(witnesses(dm.spec.decision)))


def test_planner_refuses_the_clash_with_a_condition_and_changes_nothing():
    raw = example()
    raw["spec"]["versions"][0]["metadata"]["outputSchema"] = OLD_EXAMPLE
    p = plan(make_dm(raw), Observations(), datetime(2026, 1, 1, tzinfo=UTC))
    assert p.children is None
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.versions[1.0.0].metadata.outputSchema rejects every trajectory" in ready["message"]


def test_a_schema_that_pins_an_unknown_reasoning_code_is_refused():
    dm = make_dm()
    schema = {"properties": {"steps": {"items": {"properties": {"reasoningCode": {"const": "NOT_A_CODE"}}}}}}
    assert "NOT_A_CODE" in output_schema_clash(schema, dm.spec.decision)
    schema["properties"]["steps"]["items"]["properties"]["reasoningCode"]["const"] = "INCOME_OK"
    assert output_schema_clash(schema, dm.spec.decision) is None


_leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["object", "array", "string", "number", "integer", "null"])}),
    st.fixed_dictionaries({"const": st.one_of(st.integers(), st.text(max_size=5), st.none())}),
    st.fixed_dictionaries({"enum": st.lists(st.text(max_size=8), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"minItems": st.integers(0, 5)}), st.fixed_dictionaries({"maximum": st.floats(-2, 2)}),
    st.just({}), st.just({"not": {}}),
)
_schemas = st.recursive(_leaf, lambda inner: st.one_of(
    st.fixed_dictionaries({"properties": st.dictionaries(st.sampled_from(
        ["steps", "step", "label", "reasoningCode", "probabilities", "confidence", "decision"]), inner, max_size=3)}),
    st.fixed_dictionaries({"items": inner}), st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"required": st.lists(st.sampled_from(["steps", "decision", "label"]), max_size=2,
                                                unique=True)}),
), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(schema=_schemas)
def test_hostile_output_schemas_get_a_verdict_never_an_exception(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    dm = make_dm()
    clash = output_schema_clash(schema, dm.spec.decision)
    validator = jsonschema.Draft202012Validator(schema)
    accepted = any(validator.is_valid(t) for t in witnesses(dm.spec.decision))
    assert (clash is None) == accepted
    if clash is not None:
        assert clash.startswith("rejects every trajectory")
