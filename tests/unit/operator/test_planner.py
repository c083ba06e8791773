"""The pure planner: first deployment to Ready, idempotence, invalid specs, drift, removed versions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from arbiter_operator.api.models import DecisionModel
from arbiter_operator.apply import merge_patch
from arbiter_operator.plan import ArtifactObservation, Observations, children_of, plan
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import example
from support.factory import make_dm

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _ready(isvc: dict) -> dict:
    return {**isvc, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def _kinds(p) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in p.children]


def _with_status(dm: DecisionModel, status: dict) -> DecisionModel:
    raw = dm.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["status"] = status
    return DecisionModel.model_validate(raw)


def _cond(p, type_):
    return next(c for c in p.status["conditions"] if c["type"] == type_)


def _converge(dm, obs_for, now=T0, rounds=6):
    """Feed the plan's status back until it stops changing (what repeated reconciles do)."""
    p = None
    for i in range(rounds):
        p = plan(dm, obs_for(p), now + timedelta(seconds=i))
        if merge_patch(dm.status.model_dump(mode="json", by_alias=True, exclude_none=True), p.status) is None:
            return dm, p
        dm = _with_status(dm, p.status)
    raise AssertionError("status did not converge")


def test_first_deployment_then_ready():
    dm = make_dm()
    p = plan(dm, Observations(), T0)
    assert _kinds(p) == [("ServingRuntime", "credit-limit-runtime"), ("ConfigMap", "credit-limit--1-0-0-decision"),
                         ("InferenceService", "credit-limit--1-0-0")]
    assert _cond(p, "Ready")["status"] == "False"
    assert _cond(p, "Reconciling")["status"] == "True"
    assert p.status["observedGeneration"] == 1
    assert all(c["observedGeneration"] == 1 for c in p.status["conditions"])
    assert p.requeue_after is not None

    isvc = next(c for c in p.children if c["kind"] == "InferenceService")
    obs = Observations(children=children_of(InferenceService={isvc["metadata"]["name"]: _ready(isvc)}))
    dm, p = _converge(_with_status(dm, p.status), lambda _: obs)
    route = next(c for c in p.children if c["kind"] == "Route")
    assert route["spec"]["to"] == {"kind": "Service", "name": "credit-limit--1-0-0-predictor", "weight": 100}
    assert _cond(p, "Ready")["status"] == "True"
    assert _cond(p, "Serving")["status"] == "True"
    assert _cond(p, "Promoted")["status"] == "True"
    assert _cond(p, "Stalled")["status"] == "False"
    assert p.status["activeVersion"] == "1.0.0"
    assert p.status["promotion"]["stable"] == "1.0.0"
    assert p.status["versions"][0]["phase"] == "Ready"


def test_converged_plan_is_stable_over_time():
    dm = make_dm()
    first = plan(dm, Observations(), T0)
    isvc = next(c for c in first.children if c["kind"] == "InferenceService")
    obs = Observations(children=children_of(InferenceService={isvc["metadata"]["name"]: _ready(isvc)}))
    dm, p = _converge(_with_status(dm, first.status), lambda _: obs)
    later = plan(dm, obs, T0 + timedelta(hours=3))
    assert merge_patch(dm.status.model_dump(mode="json", by_alias=True, exclude_none=True), later.status) is None
    assert later.children == p.children
    assert later.events == []


def test_invalid_fallback_cel_stalls_and_touches_nothing():
    raw = example()
    raw["spec"]["decision"]["fallbackRules"][0]["when"] = "input.requestedLimit >"
    p = plan(make_dm(raw), Observations(), T0)
    assert p.children is None and p.deletions == []
    stalled = _cond(p, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec"
    assert "large-request-needs-review" in stalled["message"] and "not valid CEL" in stalled["message"]
    assert _cond(p, "Ready")["reason"] == "InvalidSpec"
    assert [e.reason for e in p.events] == ["InvalidSpec"]


def test_spec_problems_follow_each_edit_of_the_spec():
    """The spec's problems are remembered per spec content: an edit that fixes or breaks a rule is seen at once, and
    going back to an earlier spec gives that spec's answer again."""
    broken, fixed = example(), example()
    broken["spec"]["decision"]["fallbackRules"][0]["when"] = "input.requestedLimit >"
    for raw, stalls in ((broken, True), (fixed, False), (broken, True), (fixed, False)):
        p = plan(make_dm(raw), Observations(), T0)
        assert any(c["type"] == "Stalled" and c["status"] == "True" for c in p.status["conditions"]) is stalls
        assert (p.children is None) is stalls


# Edits of a spec, each to a part the operator-side checks read or one they do not.
SPEC_EDITS = {
    "weights": lambda spec: spec["versions"][0].update(storageUri="s3://models/elsewhere/1.0.0"),
    "gpus": lambda spec: spec["serving"].update(gpus=2),
    "broken rule": lambda spec: spec["decision"]["fallbackRules"][0].update(when="input.requestedLimit >"),
    "broken schema": lambda spec: spec["versions"][0]["metadata"]["inputSchema"].update(type="objekt"),
    "version name": lambda spec: spec["versions"][0].update(name="1.0.1"),
    "version override": lambda spec: spec["versions"][0].update(decision={"labels": ["ok", "okay"]}),
    "labels": lambda spec: spec["decision"].update(labels=["ok", "okay"]),
    "vllm args": lambda spec: spec["serving"]["vllm"].update(extraArgs=["--port", "1"]),
}


@settings(max_examples=60, deadline=None)
@given(edits=st.lists(st.lists(st.sampled_from(sorted(SPEC_EDITS)), max_size=3), min_size=1, max_size=6))
def test_a_remembered_spec_check_is_the_check_itself(edits):
    """Checks are remembered by the parts of the spec they read: whatever the edits, the answer is a fresh check's."""
    from arbiter_operator.plan.validate import _check, operator_side_problems

    for chosen in edits:
        raw = example()
        raw["spec"]["promote"] = {"version": raw["spec"]["versions"][0]["name"]}
        for name in chosen:
            SPEC_EDITS[name](raw["spec"])
            raw["spec"]["promote"] = {"version": raw["spec"]["versions"][0]["name"]}
        spec = make_dm(raw).spec
        assert operator_side_problems(spec) == _check(spec)


def test_kopf_handles_no_resource_so_it_never_writes_to_a_decisionmodel():
    """kopf runs the operator's log-in, start-up and clean-up only. Its resource handlers would store progress and a
    diff base on the DecisionModel (change handlers) or add a finalizer (daemons, timers); the watches are the
    operator's own (kube/watch.py), DecisionModels included."""
    import kopf
    from arbiter_operator import handlers
    from arbiter_operator.app import Operator, OperatorConfig

    registry = handlers.register(kopf.OperatorRegistry(), Operator(OperatorConfig()))
    for kind in (registry._changing, registry._watching, registry._indexing, registry._spawning, registry._webhooks):
        assert kind.get_all_handlers() == []
    assert registry._activities.get_all_handlers()  # the registry inspected is the one the handlers went into


def test_invalid_json_schema_stalls():
    raw = example()
    raw["spec"]["versions"][0]["metadata"]["inputSchema"] = {"type": "objekt"}
    p = plan(make_dm(raw), Observations(), T0)
    assert p.children is None
    assert "inputSchema is not a valid JSON Schema" in _cond(p, "Stalled")["message"]


def test_failed_isvc_reports_why():
    dm = make_dm()
    p = plan(dm, Observations(), T0)
    isvc = next(c for c in p.children if c["kind"] == "InferenceService")
    failed = {**isvc, "status": {"conditions": [{"type": "Ready", "status": "False"}],
                                 "modelStatus": {"transitionStatus": "BlockedByFailedLoad",
                                                 "lastFailureInfo": {"message": "CUDA out of memory"}}}}
    obs = Observations(children=children_of(InferenceService={isvc["metadata"]["name"]: failed}))
    p2 = plan(_with_status(dm, p.status), obs, T0)
    assert p2.status["versions"][0]["phase"] == "Failed"
    assert "CUDA out of memory" in p2.status["versions"][0]["message"]
    assert _cond(p2, "Ready")["status"] == "False"


def test_version_not_live_is_deleted():
    dm = make_dm()
    stray = {"metadata": {"name": "credit-limit--0-9-0", "labels": {"arbiter.dev/version": "0.9.0"}}}
    stray_cm = {"metadata": {"name": "credit-limit--0-9-0-decision"}}
    p = plan(dm, Observations(children=children_of(InferenceService={"credit-limit--0-9-0": stray},
                                                   ConfigMap={"credit-limit--0-9-0-decision": stray_cm})), T0)
    assert ("serving.kserve.io/v1beta1", "InferenceService", "credit-limit--0-9-0") in p.deletions
    assert ("v1", "ConfigMap", "credit-limit--0-9-0-decision") in p.deletions


def test_invalid_artifacts_deploy_nothing_for_the_version():
    obs = Observations(artifacts={"1.0.0": ArtifactObservation(valid=False, reason="TensorParallelMismatch",
                                                               message="tensor parallel 3 does not divide 32")})
    p = plan(make_dm(), obs, T0)
    assert not any(c["kind"] == "InferenceService" for c in p.children)
    assert p.status["versions"][0]["phase"] == "Invalid"


def test_route_admission_failure_is_reported():
    dm = make_dm()
    first = plan(dm, Observations(), T0)
    isvc = next(c for c in first.children if c["kind"] == "InferenceService")
    route = {"metadata": {"name": "credit-limit"}, "spec": {},
             "status": {"ingress": [{"host": "x", "conditions": [{"type": "Admitted", "status": "False",
                                                                 "reason": "HostAlreadyClaimed",
                                                                 "message": "host claimed by another namespace"}]}]}}
    obs = Observations(children=children_of(InferenceService={isvc["metadata"]["name"]: _ready(isvc)},
                                                   Route={"credit-limit": route}))
    _, p = _converge(_with_status(dm, first.status), lambda _: obs)
    exposed = _cond(p, "Exposed")
    assert (exposed["status"], exposed["reason"]) == ("False", "RouteNotAdmitted")
    assert "host claimed" in exposed["message"]
    assert _cond(p, "Ready")["status"] == "False"


def test_every_condition_carries_the_current_generation():
    dm = make_dm()
    first = plan(dm, Observations(), T0)
    raw = example()
    raw["spec"]["decision"]["fallbackRules"][0]["when"] = "input.x >"
    bad = _with_status(make_dm(raw, generation=2), first.status)
    p = plan(bad, Observations(), T0)
    assert p.status["observedGeneration"] == 2
    assert {c["observedGeneration"] for c in p.status["conditions"]} == {2}
    serving = _cond(p, "Serving")  # kept from before, not recomputed, but current
    assert serving["lastTransitionTime"] == next(
        c for c in first.status["conditions"] if c["type"] == "Serving")["lastTransitionTime"]


def test_admitted_route_gives_the_url():
    dm = make_dm()
    first = plan(dm, Observations(), T0)
    isvc = next(c for c in first.children if c["kind"] == "InferenceService")
    route = {"metadata": {"name": "credit-limit"}, "spec": {},
             "status": {"ingress": [{"host": "credit-limit-team-a.apps.example.com",
                                     "conditions": [{"type": "Admitted", "status": "True"}]}]}}
    obs = Observations(children=children_of(InferenceService={isvc["metadata"]["name"]: _ready(isvc)},
                                                   Route={"credit-limit": route}))
    _, p = _converge(_with_status(dm, first.status), lambda _: obs)
    assert p.status["url"] == "https://credit-limit-team-a.apps.example.com"
    assert _cond(p, "Exposed")["reason"] == "RouteAdmitted"
    assert _cond(p, "Ready")["status"] == "True"


def test_stable_version_removed_from_spec_keeps_serving_until_successor_serves():
    """Nothing is lost: the serving version leaves spec.versions; its InferenceService stays (neither re-applied nor
    deleted) and keeps all traffic until the version spec.promote names serves, then it is stopped."""
    dm = make_dm()
    first = plan(dm, Observations(), T0)
    v1 = _ready(next(c for c in first.children if c["kind"] == "InferenceService"))
    v1_cm = next(c for c in first.children if c["kind"] == "ConfigMap")
    obs1 = Observations(children=children_of(InferenceService={"credit-limit--1-0-0": v1},
                                             ConfigMap={v1_cm["metadata"]["name"]: v1_cm}))
    dm, _ = _converge(_with_status(dm, first.status), lambda _: obs1)

    raw = dm.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["spec"]["versions"][0].update(name="2.0.0", storageUri="s3://models/credit-limit/2.0.0")
    raw["spec"]["promote"] = {"version": "2.0.0", "strategy": "Immediate", "rollbackWindowSeconds": 0}
    raw["metadata"]["generation"] = 2
    dm2 = DecisionModel.model_validate(raw)

    p = plan(dm2, obs1, T0 + timedelta(minutes=1))
    assert ("serving.kserve.io/v1beta1", "InferenceService", "credit-limit--1-0-0") not in p.deletions
    assert ("v1", "ConfigMap", "credit-limit--1-0-0-decision") not in p.deletions
    assert ("InferenceService", "credit-limit--1-0-0") not in _kinds(p)  # no spec to render it from: left as it is
    assert ("InferenceService", "credit-limit--2-0-0") in _kinds(p)
    route = next(c for c in p.children if c["kind"] == "Route")
    assert route["spec"]["to"]["name"] == "credit-limit--1-0-0-predictor"
    serving = _cond(p, "Serving")
    assert serving["status"] == "True"
    assert "1.0.0 left spec.versions" in serving["message"] and "stopped once 2.0.0" in serving["message"]
    gone = next(v for v in p.status["versions"] if v["name"] == "1.0.0")
    assert gone["phase"] == "Ready" and "left spec.versions" in gone["message"]

    # The successor turns ready: it is promoted, and only then is the removed version's InferenceService deleted.
    v2 = _ready(next(c for c in p.children if (c["kind"], c["metadata"]["name"]) ==
                     ("InferenceService", "credit-limit--2-0-0")))
    obs2 = Observations(children=children_of(InferenceService={"credit-limit--1-0-0": v1, "credit-limit--2-0-0": v2},
                                             ConfigMap=obs1.of_kind("ConfigMap")))
    dm2, p2 = _converge(_with_status(dm2, p.status), lambda _: obs2, now=T0 + timedelta(minutes=2))
    assert p2.status["promotion"]["stable"] == "2.0.0"
    assert ("serving.kserve.io/v1beta1", "InferenceService", "credit-limit--1-0-0") in p2.deletions
    assert ("v1", "ConfigMap", "credit-limit--1-0-0-decision") in p2.deletions
    assert next(c for c in p2.children if c["kind"] == "Route")["spec"]["to"]["name"] == "credit-limit--2-0-0-predictor"
    assert "left spec.versions" not in _cond(p2, "Serving")["message"]


def test_the_models_alerts_only_where_the_prometheusrule_api_is_served():
    dm = make_dm()
    assert not any(c["kind"] == "PrometheusRule" for c in plan(dm, Observations(podmonitor_api=True), T0).children)
    p = plan(dm, Observations(prometheusrule_api=True), T0)
    (rule,) = [c for c in p.children if c["kind"] == "PrometheusRule"]
    assert rule["metadata"]["name"] == "credit-limit"
    assert rule["metadata"]["ownerReferences"][0]["kind"] == "DecisionModel"
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    # Every alert reads this model's series only: another model in the namespace is not judged by its bounds.
    assert exprs.count('arbiter_dev_decision_model="credit-limit"') >= len(rule["spec"]["groups"][0]["rules"])


def test_podmonitor_only_where_the_api_is_served():
    dm = make_dm()
    assert not any(c["kind"] == "PodMonitor" for c in plan(dm, Observations(), T0).children)
    p = plan(dm, Observations(podmonitor_api=True), T0)
    assert ("PodMonitor", "credit-limit") in _kinds(p)


def test_the_podmonitor_presents_the_operators_metrics_reader_secret():
    p = plan(make_dm(), Observations(podmonitor_api=True, metrics_reader_secret="prometheus-reader"), T0)
    (pm,) = [c for c in p.children if c["kind"] == "PodMonitor"]
    assert [e["authorization"]["credentials"] for e in pm["spec"]["podMetricsEndpoints"]] == \
        [{"name": "prometheus-reader", "key": "token"}] * 2
