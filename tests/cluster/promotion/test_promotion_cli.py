"""`kubectl arbiter` against the real apiserver, on DecisionModels whose status the operator's planner produced."""

from __future__ import annotations

import copy
import io
from datetime import timedelta

import pytest
from arbiter_operator.cli.kubectl_arbiter import main
from kubernetes import client
from support.plannerdrive import Driver, candidate_ready, failing_canary, two_versions

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
pytestmark = pytest.mark.cluster


def failed_promotion() -> Driver:
    """1.0.0 stable, 1.1.0 rolled back by a latency breach."""
    d, _ = failing_canary()
    d.reconcile(1)
    assert d.body["status"]["promotion"]["phase"] == "Failed"
    return d


def progressing() -> Driver:
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    assert d.body["status"]["promotion"]["phase"] == "Progressing"
    return d


@pytest.fixture
def put(control_plane, namespace):
    api = control_plane.api_client()
    objs = client.CustomObjectsApi(api)

    def put(d: Driver, **metadata) -> str:
        body = copy.deepcopy(d.body)
        status = body.pop("status")
        body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace, **metadata}
        objs.create_namespaced_custom_object(G, V, namespace, P, body)
        objs.patch_namespaced_custom_object_status(G, V, namespace, P, body["metadata"]["name"], {"status": status})
        return body["metadata"]["name"]

    put.get = lambda name: objs.get_namespaced_custom_object(G, V, namespace, P, name)  # type: ignore[attr-defined]
    yield put
    api.close()


def run(control_plane, namespace, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--kubeconfig", str(control_plane.kubeconfig), *args, "-n", namespace], out=out)
    return code, out.getvalue()


def test_status_and_history_tell_what_happened(control_plane, namespace, put):
    name = put(failed_promotion())
    code, text = run(control_plane, namespace, "status", name)
    assert code == 0
    assert "Phase:       Failed" in text and "Stable:      1.0.0" in text
    assert "AnalysisFailed" in text and "400.0ms" in text and "kubectl arbiter retry" in text
    code, text = run(control_plane, namespace, "history", name)
    lines = text.splitlines()
    assert code == 0 and lines[1].split()[1:4] == ["1.1.0", "1.0.0", "RolledBack"]
    assert lines[2].split()[1:4] == ["1.0.0", "-", "Succeeded"]


def test_retry_sets_the_annotation_and_refuses_when_nothing_failed(control_plane, namespace, put, capsys):
    name = put(failed_promotion())
    code, text = run(control_plane, namespace, "retry", name)
    assert code == 0 and "retry of 1.1.0 requested" in text
    obj = put.get(name)
    assert obj["metadata"]["annotations"]["arbiter.dev/retry"]
    assert obj["spec"]["promote"]["version"] == "1.1.0"  # spec untouched: nothing for Argo CD to see as drift

    d = progressing()
    d.body["metadata"]["name"] = "running"
    running = put(d)
    code, _ = run(control_plane, namespace, "retry", running)
    assert code == 1 and "nothing to retry" in capsys.readouterr().err
    assert "arbiter.dev/retry" not in (put.get(running)["metadata"].get("annotations") or {})


def test_abort_rolls_back_by_annotation_and_leaves_spec_alone(control_plane, namespace, put, capsys):
    name = put(progressing())
    code, text = run(control_plane, namespace, "abort", name)
    assert code == 0 and "rolls back to 1.0.0" in text
    obj = put.get(name)
    assert obj["metadata"]["annotations"]["arbiter.dev/abort"]
    assert obj["spec"]["promote"]["version"] == "1.1.0"


def test_promote_edits_spec_unless_argo_cd_manages_it(control_plane, namespace, put, capsys):
    d = Driver(two_versions("1.0.0"))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    name = put(d)
    code, text = run(control_plane, namespace, "promote", name, "1.1.0", "--strategy", "Canary")
    assert code == 0 and "promoting 1.1.0" in text
    assert put.get(name)["spec"]["promote"]["version"] == "1.1.0"
    assert put.get(name)["spec"]["promote"]["strategy"] == "Canary"

    code, _ = run(control_plane, namespace, "promote", name, "9.9.9")
    assert code == 1 and "not one of spec.versions" in capsys.readouterr().err

    d.body["metadata"]["name"] = "gitops"
    managed = put(d, annotations={"argocd.argoproj.io/tracking-id": "app:arbiter.dev/DecisionModel:ns/gitops"})
    code, text = run(control_plane, namespace, "promote", managed, "1.1.0")
    assert code == 3 and "managed by Argo CD" in text and '+   version: "1.1.0"' in text
    assert put.get(managed)["spec"]["promote"]["version"] == "1.0.0"
    code, text = run(control_plane, namespace, "promote", managed, "1.1.0", "--gitops")
    assert code == 0 and text.startswith("# In the Git manifest") and '-   version: "1.0.0"' in text


def paused() -> Driver:
    """1.0.0 stable; 1.1.0 passed its one canary step and waits for approval at 10%."""
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}],
                        approval="Required", analysis={"intervalSeconds": 60, "minRequests": 50})
    d.now += timedelta(seconds=60)
    d.reconcile(0, d.analysis(0.05, 0, 500))
    assert d.body["status"]["promotion"]["phase"] == "Paused"
    return d


def test_approve_through_the_plugin_lets_a_paused_promotion_finish(control_plane, namespace, put, capsys):
    d = paused()
    name = put(d)
    code, text = run(control_plane, namespace, "status", name)
    assert code == 0 and "Phase:       Paused" in text and "kubectl arbiter approve" in text
    # Every gate with its measured value and bound.
    assert "fallbackRate" in text and "decisionMixShift" in text and "p95LatencyMs" in text and "<= 150" in text

    code, _ = run(control_plane, namespace, "approve", name, "1.0.0")
    assert code == 1 and "not 1.0.0" in capsys.readouterr().err
    code, text = run(control_plane, namespace, "approve", name)
    assert code == 0 and "1.1.0 approved" in text
    obj = put.get(name)
    value = obj["metadata"]["annotations"]["arbiter.dev/approve"]
    assert value.startswith("1.1.0@") and obj["spec"]["promote"]["version"] == "1.1.0"

    # The operator's planner, given the annotation the plugin wrote, promotes.
    d.body["metadata"].setdefault("annotations", {})["arbiter.dev/approve"] = value
    s = d.reconcile(1)
    assert s["status"]["promotion"]["phase"] == "Cooling" and s["status"]["promotion"]["stable"] == "1.1.0"


def test_approve_refuses_when_nothing_runs(control_plane, namespace, put, capsys):
    d, _ = failing_canary()
    d.reconcile(1)
    name = put(d)
    code, _ = run(control_plane, namespace, "approve", name)
    assert code == 1 and "nothing to approve" in capsys.readouterr().err
    assert "arbiter.dev/approve" not in (put.get(name)["metadata"].get("annotations") or {})
