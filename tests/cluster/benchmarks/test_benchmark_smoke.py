"""CI smoke test of the operator benchmarks (benchmarks/convergence.py, scale.py, idle.py, fleet_floor.py,
wire_floor.py): reduced versions run end to end against the local cluster (KServe's controller, scheduler, kwok
nodes), the S3 server and the operator process, and must print their table and write their JSON. No timing is asserted
here: the figures belong in docs/benchmarks.md."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest
from support.paths import REPO

ROOT = REPO

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def run(script: str, tmp_path: pathlib.Path, *args: str) -> tuple[str, dict]:
    from arbiter_devenv.tools import ensure_tool

    for tool in ("etcd", "kube-apiserver", "seaweedfs"):
        ensure_tool(tool)
    out = tmp_path / f"{script}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout, json.loads(out.read_text())


def test_convergence_runs_and_reports_operator_and_floor(tmp_path):
    stdout, result = run("convergence", tmp_path, "--repetitions", "3")
    assert "| operator |" in stdout and "| API floor |" in stdout
    assert result["operator_seconds"]["n"] == 3 and result["floor_seconds"]["n"] == 3
    # The floor replays what the operator wrote: at least the InferenceService and the Ready status.
    replayed = [w for p in result["floor_writes"] for w in p]
    assert any(w.startswith(("create InferenceService", "apply InferenceService")) for w in replayed)
    assert any(w.startswith("patch-status DecisionModel") for w in replayed)


def test_scale_converges_all_and_counts_operator_requests(tmp_path):
    stdout, result = run("scale", tmp_path, "--count", "6", "--namespaces", "2")
    assert "## Scale: 6 DecisionModels in 2 namespaces" in stdout
    assert result["all_ready"] and result["ready_count"] == 6
    # Requests are attributed to the operator's own identity: its status writes are among them.
    assert result["operator_requests"].get("patch decisionmodels/status", 0) >= 6
    assert result["operator_peak_rss_bytes"] > 0
    # The operator's share is measured apart from KServe's: it made one InferenceService per DecisionModel, and the
    # lag from KServe's Ready to the DecisionModel's is measured for them (two watches: it may be a hair below 0).
    assert result["isvcs_created"] == 6
    assert math.isfinite(result["ready_after_isvc_ready_max"]) and math.isfinite(result["all_isvcs_created_seconds"])


def test_idle_measures_a_window_after_convergence(tmp_path):
    stdout, result = run("idle", tmp_path, "--count", "6", "--namespaces", "2", "--seconds", "15", "--settle", "3")
    assert "## Idle: 6 Ready DecisionModels" in stdout
    assert result["setup"]["all_ready"]
    assert 14 <= result["window_seconds"] < 60
    assert "operator_requests_per_minute" in result


def test_fleet_floor_brings_every_model_ready_with_no_operator(tmp_path):
    stdout, result = run("fleet_floor", tmp_path, "--count", "6", "--namespaces", "2")
    assert "## Fleet floor: 6 DecisionModels in 2 namespaces, no operator" in stdout
    # Every model Ready from the replayed writes alone (the operator was stopped after the template).
    assert result["all_ready"] and not result["errors"]
    assert math.isfinite(result["all_ready_seconds"]) and result["all_ready_seconds"] >= result["ready_seconds_p50"]
    # KServe's own ConfigMap reads are counted from the audit log: it reads them on every reconcile of each of the
    # six InferenceServices, and that count is what bounds a fleet's Ready time at KServe's client rate limit.
    assert result["kserve_configmap_gets"] >= 6
    assert result["kserve_configmap_bound_seconds"] == result["kserve_configmap_gets"] / 20
    assert "KServe's ConfigMap GETs (per DecisionModel)" in stdout


def test_wire_floor_replays_the_operators_writes_from_its_own_watches(tmp_path):
    stdout, result = run("wire_floor", tmp_path, "--count", "6", "--namespaces", "2")
    assert ("## Wire floor: 6 DecisionModels in 2 namespaces, replayed with no logic "
            "(watches: all, client: aiohttp)") in stdout
    # Every model Ready from what the replayer wrote on hearing of it, none of its writes refused.
    assert result["all_ready"] and result["failed_writes"] == 0 and result["watch_errors"] == 0
    # It wrote as the operator wrote for the template, under the operator's identity: the children, at least two
    # status patches (the first and Ready) and one Event for each DecisionModel, each refused write counted.
    template = result["template_writes"]
    assert template["patch decisionmodels/status"] >= 2 and template["create events"] >= 1
    assert template["patch inferenceservices"] >= 1
    for request, per_dm in template.items():
        assert result["requests"].get(request, 0) == 6 * per_dm, (request, result["requests"], template)
    # And it heard what the operator hears: at least each DecisionModel's creation and its two status echoes.
    assert result["watch_events_per_dm"] >= 3
    assert result["replayer_cpu_seconds"] > 0 and result["replayer_peak_rss_mib"] > 0
