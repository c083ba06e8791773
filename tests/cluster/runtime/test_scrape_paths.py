"""One scrape path per decision series, counted by a real Prometheus scraping real decision servers.

On OpenShift AI two monitors can select a predictor pod: the DecisionModel's PodMonitor (the operator renders it)
and the ServiceMonitor odh-model-controller makes for every InferenceService, which scrapes only when it also made a
metrics Service, i.e. when the ServingRuntime's `spec.annotations` carry `prometheus.io/port` (its
KserveRawMetricsServiceReconciler; the path from `prometheus.io/path`). Here the objects the operator renders with
the chart's defaults are turned into scrape jobs as prometheus-operator turns them (one job per PodMonitor endpoint,
the pod's labels; one per ServiceMonitor endpoint, the Service's), against a decision-server process standing for
the pod. Every decision series must be stored once: the sum over the pod equals what the pod counted. The same
translation for a ServingRuntime that still carries the `prometheus.io/*` annotations (what earlier releases
rendered) stores them twice, which is the fleet sum this guards against.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from arbiter_operator.render import render_podmonitor, render_servingruntime
from prometheus_client.parser import text_string_to_metric_families
from support.factory import make_dm
from support.polling import eventually
from support.promstack import _free_port, _wait_http, prometheus_binary
from support.runtime_procs import CASES, RuntimeFleet

pytestmark = [pytest.mark.slow]

PROM_PORT_ANNOTATION, PROM_PATH_ANNOTATION = "prometheus.io/port", "prometheus.io/path"


def odh_service_monitor_endpoints(runtime: dict[str, Any]) -> list[str]:
    """The paths odh-model-controller's ServiceMonitor for an InferenceService of this runtime scrapes: none unless
    it made the metrics Service, which it does only for a runtime with `prometheus.io/port`."""
    annotations = runtime["spec"].get("annotations") or {}
    if not annotations.get(PROM_PORT_ANNOTATION):
        return []
    path = (annotations.get(PROM_PATH_ANNOTATION) or "").strip()
    return [path if path.startswith("/") else "/" + path] if path else ["/metrics"]


def scrape_jobs(podmonitor: dict[str, Any], runtime: dict[str, Any], proc: Any) -> list[dict[str, Any]]:
    """Both monitors' scrape jobs for one predictor pod (the process `proc`), as prometheus-operator writes them."""
    pod = proc.labels()
    target = f"127.0.0.1:{proc.port}"
    ns, name = podmonitor["metadata"]["namespace"], podmonitor["metadata"]["name"]
    # podTargetLabels: the pod's labels, their names sanitised as Prometheus does (arbiter.dev/version ->
    # arbiter_dev_version); the process's labels() are the pod's under those names.
    copied = {n: pod[n] for n in (re.sub(r"[^a-zA-Z0-9_]", "_", label)
                                  for label in podmonitor["spec"]["podTargetLabels"])}

    def labels(endpoint: dict[str, Any]) -> dict[str, str]:
        # prometheus-operator's own labels (`endpoint`: the port's name), then the endpoint's relabelings (here only
        # `replace` of a fixed value, which is all the operator renders).
        out = {"job": f"{ns}/{name}", "namespace": pod["namespace"], "pod": pod["pod"], "container": pod["container"],
               "endpoint": endpoint["port"], **copied}
        for rule in endpoint.get("relabelings", []):
            assert rule["action"] == "replace" and "sourceLabels" not in rule, rule
            out[rule["targetLabel"]] = rule["replacement"]
        return out

    jobs = [{"job_name": f"podMonitor/{ns}/{name}/{i}/{pod['pod']}", "scrape_interval": "1s",
             "metrics_path": endpoint["path"], "static_configs": [{"targets": [target], "labels": labels(endpoint)}]}
            for i, endpoint in enumerate(podmonitor["spec"]["podMetricsEndpoints"])]
    isvc = pod["serving_kserve_io_inferenceservice"]
    jobs += [{"job_name": f"serviceMonitor/{ns}/{isvc}-metrics/{i}/{pod['pod']}", "scrape_interval": "1s",
              "metrics_path": path,
              "static_configs": [{"targets": [target], "labels": {
                  "job": f"{isvc}-metrics", "namespace": pod["namespace"], "pod": pod["pod"],
                  "service": f"{isvc}-metrics"}}]}
             for i, path in enumerate(odh_service_monitor_endpoints(runtime))]
    return jobs


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        return json.load(r)["data"]["result"]


def counted(proc: Any) -> float:
    families = text_string_to_metric_families(proc.metrics_text())
    return sum(s.value for f in families for s in f.samples if s.name == "arbiter_decisions_total")


def test_each_decision_series_is_stored_once_with_the_charts_defaults(tmp_path: Path) -> None:
    binary = prometheus_binary()
    assert binary, "prometheus not found: apt-get install prometheus (hack/setup.sh does)"
    dm = make_dm()
    podmonitor = render_podmonitor(dm)
    runtime = render_servingruntime(dm)  # the operator's default settings: what the chart installs
    assert odh_service_monitor_endpoints(runtime) == []  # odh-model-controller makes no metrics Service for it
    legacy = copy.deepcopy(runtime)  # what earlier releases rendered
    legacy["spec"]["annotations"] = {PROM_PORT_ANNOTATION: "8080", PROM_PATH_ANNOTATION: "/metrics"}

    with RuntimeFleet(tmp_path / "fleet", namespace=dm.metadata.namespace, model=dm.metadata.name) as fleet:
        now, before = fleet.start_version("1.0.0"), fleet.start_version("0.9.0")
        port = _free_port()
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": scrape_jobs(podmonitor, runtime, now) + scrape_jobs(podmonitor, legacy, before)}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=open(tmp_path / "prometheus.log", "w"),
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_http(f"{url}/-/ready")
            for proc in (now, before):
                for case in CASES[:5]:
                    proc.decide(case)
            want = {p.labels()["pod"]: counted(p) for p in (now, before)}
            assert all(v == 5 for v in want.values()), want
            time.sleep(1.5)  # the next scrape sees the decisions made
            # Both jobs that scrape the legacy pod must have scraped it since its decisions: wait for its double.
            now_pod, before_pod = now.labels()["pod"], before.labels()["pod"]
            least = {now_pod: want[now_pod], before_pod: 2 * want[before_pod]}
            sums = eventually(lambda: (r := {s["metric"]["pod"]: float(s["value"][1]) for s in query(
                url, "sum by (pod) (arbiter_decisions_total)")}) and len(r) == 2 and all(
                v >= least[p] for p, v in r.items()) and r, 30, "both pods scraped by every job", interval=0.5)
            # The chart's defaults: one path, every decision counted once...
            assert sums[now.labels()["pod"]] == want[now.labels()["pod"]]
            # ...each series once, by the PodMonitor's job (carrying the version the analysis selects by).
            series = query(url, f'arbiter_decisions_total{{pod="{now.labels()["pod"]}"}}')
            assert {s["metric"]["job"] for s in series} == {f"{dm.metadata.namespace}/{dm.metadata.name}"}
            assert all(s["metric"]["arbiter_dev_version"] == "1.0.0" for s in series)
            # With the prometheus.io annotations the same pod's decisions are stored twice.
            assert sums[before.labels()["pod"]] == 2 * want[before.labels()["pod"]]
            # The PodMonitor's second endpoint brings vLLM's series, stored once too (one job; the stand-in's
            # KV-cache gauge is one series per pod). It is a target of its own, scraped on its own schedule: wait
            # for its first scrape rather than assume the decisions' target's scrape brought it.
            vllm = eventually(lambda: query(url, f'count by (job) (vllm:kv_cache_usage_perc{{pod="{now_pod}"}})'),
                              30, "the vLLM endpoint scraped", interval=0.5)
            assert [(s["metric"]["job"], s["value"][1]) for s in vllm] == [
                (f"{dm.metadata.namespace}/{dm.metadata.name}", "1")], vllm
            # Each of the PodMonitor's two targets on the pod has an `up` of its own (one port, two endpoints).
            ups = query(url, f'up{{pod="{now.labels()["pod"]}"}}')
            assert sorted((s["metric"]["endpoint"], s["value"][1]) for s in ups) == [("http1", "1"), ("vllm", "1")], ups
        finally:
            prom.terminate()
            prom.wait(timeout=10)
