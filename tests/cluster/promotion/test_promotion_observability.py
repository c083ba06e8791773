"""What an SRE sees of a promotion that rolls back, in the real Prometheus: the real operator process (scraped as the
chart's ServiceMonitor does), real decision-server processes per version, the chart's alerts and the alerts the
operator rendered for the model in the cluster, evaluated by Prometheus itself; and every dashboard panel's query
answered with data.

DCGM's GPU utilisation comes from a stand-in exporter (no GPU here) with the real metric name and pod labels. A
second DecisionModel in the namespace is one the operator refuses (an outputSchema nested past its limit), so the
panels on refused objects and models not Ready have something to show.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
from arbiter_devenv.dashboards import panel_queries
from support.chartkit import of_kind, render
from support.decision_e2e_kit import DecisionE2E
from support.e2e_kit import V1, V2, fast_canary
from support.promstack import PromStack, module_stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ANALYSIS = {"intervalSeconds": 5, "minRequests": 20, "insufficientTraffic": "Wait", "p95LatencyMs": 3000}

stack = module_stack()


@pytest.fixture
def e2e(control_plane, namespace, stack, tmp_path, s3_server):
    env = DecisionE2E(control_plane, namespace, stack, tmp_path, s3_server)
    env.operator.metrics = True
    env.start_operator()
    stack.add_operator(namespace, env.operator.metrics_port)
    try:
        # Scraped before anything happens: a counter's first sample must be its 0, or its first increase is lost.
        env.wait(lambda: query(stack, f'up{{job="arbiter-metrics",pod="arbiter-operator-{namespace}"}} == 1'),
                 "the operator scraped", 30)
        yield env
    finally:
        stack.remove_operator(namespace)
        env.close()


def _get(stack: PromStack, path: str, **params: Any) -> Any:
    url = f"{stack.url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def query(stack: PromStack, expr: str) -> list[dict[str, Any]]:
    return _get(stack, "/api/v1/query", query=expr)["result"]


def query_range(stack: PromStack, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    return _get(stack, "/api/v1/query_range", query=expr, start=start, end=end, step=1)["result"]


def firing(stack: PromStack, alertname: str, **labels: str) -> list[dict[str, Any]]:
    return [a for a in _get(stack, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == alertname and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def chart_rule_groups() -> list[dict[str, Any]]:
    docs = render({"alerts": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}})
    return of_kind(docs, "PrometheusRule")[0]["spec"]["groups"]


def refused_model(e: DecisionE2E) -> None:
    """A DecisionModel the apiserver admits and the operator refuses: its outputSchema nests past 64 levels."""
    body = copy.deepcopy(e.dm())
    body["metadata"] = {"name": "too-deep", "namespace": e.ns}
    body.pop("status", None)
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(70):
        schema = {"type": "object", "properties": {"x": schema}}
    body["spec"]["versions"][0]["metadata"]["outputSchema"] = schema
    e.objs.create_namespaced_custom_object("arbiter.dev", "v1alpha1", e.ns, "decisionmodels", body)


def test_a_rollback_shows_in_the_state_series_fires_its_alert_and_fills_every_panel(e2e, stack):
    e, ns = e2e, e2e.ns
    start = time.time()
    e.create(V1, candidate="fallback", **fast_canary(analysis=ANALYSIS, steps=[{"weight": 10, "holdSeconds": 10}]))
    e.wait(lambda: V1 in e.isvcs(), "1.0.0 InferenceService")
    e.set_state(V1, "ready")
    assert e.wait_phase("Idle")["stable"] == V1
    refused_model(e)
    # The alerts as they reach a cluster: the chart's, and the ones the operator made for this model.
    rule = e.wait(lambda: e.objs.list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", ns, "prometheusrules", label_selector=f"arbiter.dev/decision-model={e.name}",
    )["items"], "the model's PrometheusRule")[0]
    stack.add_rules(f"model-{ns}", rule["spec"]["groups"])
    stack.add_rules("chart", chart_rule_groups())
    for proc in e.procs.values():
        stack.add_gpu_pod(ns, proc.labels()["pod"], 12.0)
    model = {"decisionmodel_namespace": ns, "decisionmodel": e.name}
    sel = f'decisionmodel_namespace="{ns}",decisionmodel="{e.name}"'
    e.wait(lambda: query(stack, f'arbiter_decisionmodel_phase{{{sel},phase="Idle"}}'), "Idle in Prometheus", 30)
    assert not firing(stack, "ArbiterPromotionRolledBack", **model)

    e.patch_promote(version=V2)
    e.wait(lambda: V2 in e.isvcs(), "1.1.0 InferenceService")
    e.set_state(V2, "ready")
    e.wait(lambda: any(r["outcome"] == "RolledBack" for r in e.promotion().get("history", [])), "the rollback", 180)

    # The rollback alert fires in Prometheus, for this model.
    alert = e.wait(lambda: firing(stack, "ArbiterPromotionRolledBack", **model), "ArbiterPromotionRolledBack", 60)[0]
    assert alert["annotations"]["runbook_url"].endswith("#arbiterpromotionrolledback")
    assert f"{ns}/{e.name}" in alert["annotations"]["summary"]

    # The rolled-back phase reaches Prometheus at the next scrape of the state series, which may come after the alert.
    e.wait(lambda: query(stack, f'arbiter_decisionmodel_phase{{{sel},phase="Failed"}}'), "Failed in Prometheus", 30)
    end = time.time() + 1
    # The state series followed the promotion: the phases it went through, the canary's weight, the failing gate.
    phases = {s["metric"]["phase"] for s in query_range(stack, f"arbiter_decisionmodel_phase{{{sel}}}", start, end)}
    assert {"Idle", "Progressing", "Failed"} <= phases, phases
    weights = query_range(stack, f'max_over_time(arbiter_decisionmodel_traffic_weight{{{sel},version="{V2}"}}[10m])',
                          start, end)
    assert max(float(v) for s in weights for _, v in s["values"]) == 10.0
    gate = query_range(stack, f'arbiter_decisionmodel_gate_value{{{sel},gate="fallbackRate"}} > on (decisionmodel) '
                       f'group_left arbiter_decisionmodel_gate_bound{{{sel},gate="fallbackRate"}}', start, end)
    assert gate, "the fallback-rate gate over its bound"
    final = query(stack, f"arbiter_decisionmodel_traffic_weight{{{sel}}}")
    assert {s["metric"]["version"]: float(s["value"][1]) for s in final} == {V1: 100.0}
    assert query(stack, f'arbiter_decisionmodel_phase{{{sel},phase="Failed"}}')

    # Every panel of every dashboard, its variables set to this model, answers with data over the test's window.
    empty = [(uid, title, expr) for uid, title, expr in panel_queries(ns, e.name)
             if not query_range(stack, expr, start, end)]
    assert empty == [], "panels without data:\n" + "\n".join(f"{u} / {t}: {x}" for u, t, x in empty)
