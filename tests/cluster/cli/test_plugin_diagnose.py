"""`kubectl arbiter diagnose` names each cause, driven on the real stack: the DecisionModel on the real apiserver (its
status written by the operator's planner), a REAL decision server in front of the vLLM stand-in told to misbehave
(tests/support/runtime_procs.py BEHAVIOURS), callers deciding while diagnose reads the server's /metrics and
/metrics/vllm with the user's kubeconfig; a model that does not serve is diagnosed from its conditions, the operator's
reason table and its Events; a user with a read-only Role on DecisionModels alone gets the verdict and is told what
could not be read."""

from __future__ import annotations

import copy
import io
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from arbiter_operator.cli.kubectl_arbiter import main
from kubernetes import client
from support.plannerdrive import Driver, two_versions
from support.runtime_procs import CASES, RuntimeFleet, RuntimeProc

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
NAME, VERSION = "credit-limit", "1.0.0"


def put(api, namespace: str, body: dict) -> None:
    """The DecisionModel and its status, as the operator's planner wrote it."""
    objs = client.CustomObjectsApi(api)
    body = copy.deepcopy(body)
    status = body.pop("status")
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace}
    objs.create_namespaced_custom_object(G, V, namespace, P, body)
    objs.patch_namespaced_custom_object_status(G, V, namespace, P, body["metadata"]["name"], {"status": status})


def serving_on(version: str) -> Driver:
    d = Driver(two_versions(version))
    d.reconcile()
    d.set_ready(version)
    d.reconcile(5)
    return d


@pytest.fixture
def model(control_plane, namespace):
    api = control_plane.api_client()
    d = serving_on(VERSION)
    d.body["spec"]["decision"]["deadlineMs"] = 300
    put(api, namespace, d.body)
    yield api
    api.close()


@contextmanager
def callers(proc: RuntimeProc, threads: int = 6) -> Iterator[None]:
    """Callers deciding on CASES without pause while the block runs (vLLM's gauges are read while they call)."""
    stop = threading.Event()

    def call() -> None:
        n = 0
        while not stop.is_set():
            try:
                proc.decide(CASES[n % len(CASES)])
            except (OSError, RuntimeError):
                pass
            n += 1

    pool = [threading.Thread(target=call, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in pool:
            t.join(15)


def diagnose(control_plane, namespace: str, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--kubeconfig", str(control_plane.kubeconfig), "-n", namespace, "diagnose", NAME, "-o", "json",
                 *args], out=out)
    return code, json.loads(out.getvalue())


# cause driven on the stand-in -> the finding diagnose must put first (and words of its verdict)
DRIVEN = {
    "fallback": ("UpstreamErrors", "fell back to the rules"),
    "down": ("UpstreamDown", "vLLM is not answering"),
    "schema": ("SchemaViolations", "break the output constraint"),
    "low_confidence": ("LowConfidence", "the model is unsure"),
    "truncated": ("TruncatedAnswers", "finish_reason: length"),
    "saturated": ("Saturated", "max-num-seqs too low or too few GPUs"),
    "long_inputs": ("InputTooLong", "maxModelLen"),
    "slow": ("DeadlineExceeded", "decision.deadlineMs"),
}


def test_each_driven_cause_is_named_first(control_plane, namespace, model, tmp_path):
    """One decision server per cause (its counters start at zero), deciding for about two seconds."""
    named = {}
    for behaviour, (code, words) in DRIVEN.items():
        overrides = {"deadlineMs": 300} if behaviour == "slow" else {}
        with RuntimeFleet(tmp_path / behaviour, namespace=namespace, model=NAME) as fleet:
            proc = fleet.start_version(VERSION, **overrides)
            proc.misbehave(behaviour, **({"delay_s": 0.6} if behaviour == "slow" else {}))
            with callers(proc):
                threading.Event().wait(2.0)
                status, found = diagnose(control_plane, namespace, "--metrics-url", proc.url)
        top = found["findings"][0]
        named[behaviour] = top["code"]
        assert status == 11, found
        assert top["code"] == code and words in top["verdict"], json.dumps(found["findings"][:2], indent=1)
        assert top["version"] == VERSION and top["fix"], top
    assert named == {b: c for b, (c, _) in DRIVEN.items()}


def test_a_healthy_model_has_no_problem(control_plane, namespace, model, tmp_path):
    with RuntimeFleet(tmp_path, namespace=namespace, model=NAME) as fleet:
        proc = fleet.start_version(VERSION)
        with callers(proc, threads=2):
            threading.Event().wait(1.5)
            status, found = diagnose(control_plane, namespace, "--metrics-url", proc.url)
    assert status == 0 and found["findings"][0]["code"] == "NoProblemFound", found
    assert any(r.startswith(f"{proc.url}/metrics") for r in found["read"])


def test_a_model_that_does_not_serve_is_diagnosed_from_conditions_table_and_events(control_plane, namespace):
    api = control_plane.api_client()
    d = Driver(two_versions(VERSION))
    d.reconcile()
    d.reconcile(60)  # its predictor never becomes ready
    put(api, namespace, d.body)
    client.CoreV1Api(api).create_namespaced_event(namespace, {
        "metadata": {"name": f"e-{uuid.uuid4().hex[:6]}"}, "type": "Warning", "reason": "FailedScheduling",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": f"{NAME}--1-0-0-predictor-abc"}})
    api.close()
    status, found = diagnose(control_plane, namespace)
    codes = [f["code"] for f in found["findings"]]
    assert status == 11 and codes[0] == "NoReadyVersion", codes
    assert "Loading: wait" in found["findings"][0]["fix"][0]  # the operator's table, docs/operations.md
    assert "EventFailedScheduling" in codes and any("FailedScheduling" in e for e in found["events"])
    assert any("the model's own metrics" in u for u in found["unreadable"])  # no --prometheus, no --metrics-url


def test_a_read_only_user_gets_the_verdict_and_what_it_could_not_read(control_plane, namespace, model, tmp_path):
    api = control_plane.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "sre"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "dm-reader"}, "rules": [
        {"apiGroups": [G], "resources": [P], "verbs": ["get", "list", "watch"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "sre-reads-dm"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dm-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "sre", "namespace": namespace}]})
    token = core.create_namespaced_service_account_token("sre", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    api.close()
    kc = control_plane.write_kubeconfig(tmp_path / "sre.kubeconfig", token=token, namespace=namespace)
    with RuntimeFleet(tmp_path / "rt", namespace=namespace, model=NAME) as fleet:
        proc = fleet.start_version(VERSION)
        proc.misbehave("fallback")
        with callers(proc, threads=2):
            threading.Event().wait(1.5)
            out = io.StringIO()
            code = main(["--kubeconfig", str(kc), "diagnose", NAME, "--metrics-url", proc.url], out=out)
    text = out.getvalue()
    assert code == 11 and "[UpstreamErrors]" in text, text
    unreadable = text.split("Could not read:", 1)[1]
    assert "Events: " in unreadable and "predictor pods: " in unreadable and "forbidden" in unreadable
    assert token not in text
