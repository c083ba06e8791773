"""Decision-aware promotion end to end: the real operator process on the local cluster (KServe's controller, the
scheduler, kwok's simulated predictor pods), a real Prometheus scraping REAL decision-server processes, one per
version, whose stand-in upstream the test tells to misbehave (decision_e2e_kit.py says what plays the kubelet).

What a user sees is asserted: the rollback condition names the metric, the measured value and the bound; a shadowed
candidate that agrees is promoted and one that disagrees is not, and shadow.json comes and goes without restarting
the stable pods; a promotion waiting for approval is Suspended for Argo CD and finishes through `kubectl arbiter
approve`."""

from __future__ import annotations

import io

import pytest
from arbiter_operator.api.models import isvc_name
from arbiter_operator.cli.kubectl_arbiter import main as kubectl_arbiter
from kubernetes import client
from support.argocd_health import health
from support.decision_e2e_kit import DecisionE2E
from support.e2e_kit import V1, V2, e2e_fixture, fast_canary
from support.promstack import module_stack

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
]

# Latency is not what these tests judge (the decision servers share two cores with the whole cluster): a loose bound.
ANALYSIS = {"intervalSeconds": 5, "minRequests": 20, "insufficientTraffic": "Wait", "p95LatencyMs": 3000}


stack = module_stack()

e2e = e2e_fixture(DecisionE2E)


def stable_on_v1(e: DecisionE2E, candidate: str = "healthy", **promote) -> None:
    e.create(V1, candidate=candidate, **promote)
    e.wait(lambda: V1 in e.isvcs(), "1.0.0 InferenceService")
    e.set_state(V1, "ready")
    assert e.wait_phase("Idle")["stable"] == V1
    e.wait(lambda: e.route_weights() == {V1: 100}, "Route 100% on 1.0.0")


def shadow_grant(e: DecisionE2E):
    """The shadow phase's Role, when both it and its RoleBinding exist."""
    rbac = client.RbacAuthorizationV1Api(e.api)
    roles = rbac.list_namespaced_role(e.ns, label_selector="arbiter.dev/component=shadow-caller").items
    bindings = rbac.list_namespaced_role_binding(e.ns, label_selector="arbiter.dev/component=shadow-caller").items
    return roles[0] if roles and bindings else None


def check_of(promotion: dict, name: str) -> dict:
    return next(c for c in promotion["lastAnalysis"]["checks"] if c["name"] == name)


@pytest.mark.parametrize(
    ("behaviour", "bounds", "metric", "words"),
    [
        ("fallback", {}, "fallbackRate", "fallback rate 100.00% above max 5.00%"),
        ("schema", {}, "schemaViolationRate", "schema violation rate"),
        ("approve_all", {}, "decisionMixShift", "decision mix shift"),
        # vLLM's own gauge, re-exported by the decision server at /metrics/vllm: a bound the user opted into.
        ("healthy", {"maxKvCacheUsage": 0.01}, "kvCacheUsage", "vLLM KV-cache use"),
    ],
)
def test_a_candidate_that_decides_badly_is_rolled_back_naming_metric_value_and_bound(e2e, behaviour, bounds, metric,
                                                                                      words):
    e = e2e
    stable_on_v1(e, candidate=behaviour,
                 **fast_canary(analysis={**ANALYSIS, **bounds}, steps=[{"weight": 10, "holdSeconds": 10}]))
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    p = e.wait_phase("Failed", "RollingBack", timeout=120)
    assert p["failureReason"] == "AnalysisFailed" and p["stable"] == V1
    stalled = e.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "AnalysisFailed"
    assert words in stalled["message"], stalled["message"]
    check = check_of(p, metric)
    assert check["verdict"] == "Fail" and check["value"] > check["bound"], check
    assert f"{check['bound'] * 100:.2f}%" in stalled["message"]  # the bound, as the user set it (or its default)
    e.wait(lambda: e.route_weights() == {V1: 100}, "traffic back on 1.0.0")
    assert e.condition("Serving")["status"] == "True"


def test_a_healthy_candidate_passes_every_decision_gate(e2e):
    e = e2e
    vllm_bounds = {"maxQueueTimeP95Ms": 1000, "maxKvCacheUsage": 0.99}
    stable_on_v1(e, **fast_canary(analysis={**ANALYSIS, **vllm_bounds}, steps=[{"weight": 10, "holdSeconds": 10}],
                                  rollbackWindowSeconds=0))
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    p = e.wait_phase("Idle", timeout=120)
    assert p["stable"] == V2, p
    checks = {c["name"]: c for c in p["lastAnalysis"]["checks"]}
    assert checks["fallbackRate"]["value"] == 0 and checks["schemaViolationRate"]["value"] == 0
    assert checks["decisionMixShift"]["verdict"] == "Pass" and checks["decisionMixShift"]["value"] is not None
    assert checks["kvCacheUsage"]["verdict"] == "Pass" and 0 < checks["kvCacheUsage"]["value"] <= 0.99
    assert checks["queueTimeP95Ms"]["verdict"] == "Pass" and checks["queueTimeP95Ms"]["value"] <= 1000


def shadow(**over) -> dict:
    settings = {"holdSeconds": 12, "minCompared": 20, "sampleRate": 1.0, "minAgreement": 0.95, "timeoutMs": 3000}
    settings.update(over)
    return fast_canary(strategy="Shadow", shadow=settings, analysis=ANALYSIS, rollbackWindowSeconds=0)


def test_a_shadowed_candidate_that_agrees_is_promoted_without_restarting_the_stable_pods(e2e):
    e = e2e
    stable_on_v1(e, **shadow())
    e.traffic.set(e.procs[V2], 0)  # a shadowed candidate gets no live traffic: only what the stable mirrors
    before = e.pod_checksum(V1)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    e.wait_phase("Shadowing")
    assert e.route_weights() == {V1: 100}
    e.wait(lambda: e.shadow_json(V1), "shadow.json in the stable's ConfigMap")
    assert e.pod_checksum(V1) == before  # mirroring on: the stable pods' template is untouched
    # Auth is on: for the shadow phase only, the stable pods may `get` the candidate's InferenceService.
    role = e.wait(lambda: shadow_grant(e), "the shadow grant")
    assert role.rules[0].resource_names == [isvc_name(e.name, V2)] and role.rules[0].verbs == ["get"]
    assert health(e.dm())[0] in ("Progressing", "Suspended")
    e.snapshot("shadowing", health(e.dm())[0])
    p = e.wait_phase("Idle", timeout=120)
    assert p["stable"] == V2
    e.wait(lambda: shadow_grant(e) is None and e.shadow_json(V1) is None, "grant and shadow.json removed")
    agreement = check_of(p, "agreement")
    assert agreement["verdict"] == "Pass" and agreement["value"] >= 0.95 and agreement["bound"] == 0.95
    assert any(cfg and cfg["candidate"] == V2 for v, cfg in e.sync.seen if v == V1)
    assert not e.sync.errors, e.sync.errors
    # The compared requests were real: the stable's audit has shadow records of the candidate's answers.
    assert any(r.get("shadow") for r in e.procs[V1].records())


def test_a_shadowed_candidate_that_disagrees_is_not_promoted(e2e):
    e = e2e
    stable_on_v1(e, candidate="disagree", **shadow())
    e.traffic.set(e.procs[V2], 0)
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    e.wait(lambda: e.shadow_json(V1), "shadow.json in the stable's ConfigMap")
    p = e.wait_phase("Failed", "RollingBack", timeout=120)
    assert p["failureReason"] == "ShadowAnalysisFailed" and p["stable"] == V1
    stalled = e.condition("Stalled")
    assert stalled["reason"] == "ShadowAnalysisFailed"
    assert "shadow agreement" in stalled["message"] and "below min 95.00%" in stalled["message"]
    agreement = check_of(p, "agreement")
    assert agreement["verdict"] == "Fail" and agreement["value"] < 0.95
    status, message = health(e.dm())
    assert status == "Degraded" and message.startswith("ShadowAnalysisFailed:")
    e.snapshot("shadow-disagreed", "Degraded")
    e.wait(lambda: e.shadow_json(V1) is None, "shadow.json removed", timeout=30)
    e.wait(lambda: (V1, None) in e.sync.seen, "the stable stops mirroring")
    assert e.route_weights() == {V1: 100}


def test_manual_approval_through_the_plugin(e2e):
    e = e2e
    stable_on_v1(e, **fast_canary(analysis=ANALYSIS, steps=[{"weight": 20, "holdSeconds": 8}],
                                  approval="Required"))
    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")
    p = e.wait_phase("Paused", timeout=120)
    assert p["weight"] == 20 and e.route_weights() == {V1: 80, V2: 20}
    dm = e.dm()
    status, message = health(dm)
    assert status == "Suspended" and "Waiting for approval: 1.1.0" in message
    assert e.condition("Reconciling", dm)["reason"] == "WaitingForApproval"
    e.snapshot("waiting-for-approval", "Suspended")

    out = io.StringIO()
    args = ["--kubeconfig", str(e.cp.kubeconfig), "-n", e.ns]
    assert kubectl_arbiter(["status", e.name, *args], out=out) == 0
    assert "Phase:       Paused" in out.getvalue() and "decisionMixShift" in out.getvalue()
    out = io.StringIO()
    assert kubectl_arbiter(["approve", e.name, *args], out=out) == 0, out.getvalue()
    p = e.wait_phase("Cooling", timeout=60)
    assert p["stable"] == V2
    e.wait(lambda: e.route_weights() == {V2: 100}, "Route 100% on 1.1.0")
    assert e.dm()["spec"]["promote"]["version"] == V2  # the spec (Git's) untouched
