"""Exposed means reachable: `Exposed=True` only where the Service the Route points to has the Route's target port
(plan/exposure.py through the planner)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from arbiter_operator.plan import Observations, plan
from support.examples import example
from support.factory import make_dm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ISVC = "credit-limit--1-0-0"
PROXY_ONLY = {"metadata": {"name": f"{ISVC}-predictor"}, "spec": {"ports": [
    {"name": "https", "port": 8443, "targetPort": 8443}]}}  # OpenShift AI's KServe with auth on
PLAIN_ONLY = {"metadata": {"name": f"{ISVC}-predictor"}, "spec": {"ports": [
    {"name": f"{ISVC}-predictor", "port": 80, "targetPort": 8080}]}}  # KServe without OpenShift AI


def _exposed(exposure: dict[str, Any], services: dict[str, Any]) -> dict[str, Any]:
    raw = example()
    raw["spec"]["exposure"] = exposure
    dm = make_dm(raw)
    first = plan(dm, Observations(), T0)
    isvc = next(c for c in first.children or [] if c["kind"] == "InferenceService")
    isvc["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    dm = dm.model_copy(update={"status": type(dm.status).model_validate(first.status)})
    p = plan(dm, Observations(children={("InferenceService", ISVC): isvc}, predictor_services=services), T0)
    return {c["type"]: c for c in p.status["conditions"]}


def test_a_route_to_a_port_the_predictor_service_lacks_is_not_exposed():
    # auth on with edge (an object from before the CRD refused it): OpenShift AI removed port 8080.
    c = _exposed({"auth": True, "tls": "edge"}, {f"{ISVC}-predictor": PROXY_ONLY})
    assert (c["Exposed"]["status"], c["Exposed"]["reason"]) == ("False", "RouteTargetPortMissing")
    assert "port 8080" in c["Exposed"]["message"] and "https:8443" in c["Exposed"]["message"]
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "RouteTargetPortMissing"
    assert "leave spec.exposure.tls unset" in c["Exposed"]["message"]
    c = _exposed({"auth": False}, {f"{ISVC}-predictor": PROXY_ONLY})
    assert (c["Exposed"]["status"], c["Exposed"]["reason"]) == ("False", "RouteTargetPortMissing")


def test_a_route_to_a_port_the_service_has_is_exposed():
    assert _exposed({"auth": True}, {f"{ISVC}-predictor": PROXY_ONLY})["Exposed"]["status"] == "True"
    assert _exposed({"auth": False}, {f"{ISVC}-predictor": PLAIN_ONLY})["Exposed"]["status"] == "True"
    # A Service not seen yet is not judged: KServe makes it with the Deployment.
    assert _exposed({"auth": True}, {})["Exposed"]["status"] == "True"
