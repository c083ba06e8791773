"""`status --watch` redraws when the DecisionModel changes, `status --timeout` gives up with exit 10, `list` shows a
namespace's or every namespace's models with -o yaml too: on the real apiserver, with statuses the operator's planner
wrote (put there as its status write would)."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml
from arbiter_operator.cli.kubectl_arbiter import main
from kubernetes import client
from support.plannerdrive import Driver, candidate_ready, two_versions

pytestmark = pytest.mark.cluster
G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"


def idle() -> Driver:
    d = Driver(two_versions())
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    return d


@pytest.fixture
def objs(control_plane):
    api = control_plane.api_client()
    yield client.CustomObjectsApi(api)
    api.close()


def put(objs, namespace: str, body: dict) -> None:
    body = copy.deepcopy(body)
    status = body.pop("status")
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace}
    objs.create_namespaced_custom_object(G, V, namespace, P, body)
    objs.patch_namespaced_custom_object_status(G, V, namespace, P, body["metadata"]["name"], {"status": status})


def plugin(control_plane, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.Popen([sys.executable, "-m", "arbiter_operator.cli.kubectl_arbiter", "--kubeconfig",
                             str(control_plane.kubeconfig), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_watch_redraws_when_the_promotion_moves(control_plane, namespace, objs):
    d = idle()
    put(objs, namespace, d.body)
    watching = plugin(control_plane, "-n", namespace, "status", "credit-limit", "--watch")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watching.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any("Phase:       Idle" in x for x in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        running = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
        objs.patch_namespaced_custom_object_status(G, V, namespace, P, "credit-limit",
                                                   {"status": running.body["status"]})
        while not any("Phase:       Progressing" in x for x in lines) and time.monotonic() < deadline + 30:
            time.sleep(0.1)
    finally:
        watching.terminate()
        watching.wait(10)
    text = "".join(lines)
    assert text.index("Phase:       Idle") < text.index("--- ") < text.index("Phase:       Progressing"), text
    assert "Candidate:   1.1.0 (step 1/" in text and "Traffic:     1.0.0 90%, 1.1.0 10%" in text


def test_timeout_while_still_moving_is_exit_10(control_plane, namespace, objs):
    put(objs, namespace, candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}]).body)
    started = time.monotonic()
    proc = plugin(control_plane, "-n", namespace, "status", "credit-limit", "--timeout", "3s")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 10, (out, err)
    assert "timed out after 3s: waiting: phase Progressing" in err
    assert time.monotonic() - started < 30


def test_list_shows_the_namespace_or_all_of_them(control_plane, namespace, objs):
    put(objs, namespace, idle().body)
    running = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    running.body["metadata"]["name"] = "fraud"
    put(objs, namespace, running.body)
    out = io.StringIO()
    assert main(["--kubeconfig", str(control_plane.kubeconfig), "-n", namespace, "list"], out=out) == 0
    rows = [line.split() for line in out.getvalue().splitlines()]
    assert rows == [["NAME", "PHASE", "ACTIVE", "CANDIDATE", "WEIGHT", "READY", "REASON"],
                    ["credit-limit", "Idle", "1.0.0", "-", "-", "True", "Promoted"],
                    ["fraud", "Progressing", "1.0.0", "1.1.0", "10%", "False", "Progressing"]]
    out = io.StringIO()
    assert main(["--kubeconfig", str(control_plane.kubeconfig), "list", "-A", "-o", "yaml"], out=out) == 0
    items = [i for i in yaml.safe_load(out.getvalue())["items"] if i["namespace"] == namespace]
    assert [(i["name"], i["phase"], i["weight"]) for i in items] == [("credit-limit", "Idle", None),
                                                                     ("fraud", "Progressing", 10)]
