"""Exposed means reachable, on the real apiserver: a Route made by hand under the DecisionModel's name is not the
operator's, so the DecisionModel is not Exposed; and the CRD refuses `auth: true` with `tls: edge`, whose Route would
point at a port OpenShift AI's KServe removes from the predictor Service."""

from __future__ import annotations

import copy
import json

from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"


def test_the_crd_refuses_auth_with_edge_and_says_what_to_write(control_plane, namespace, api):
    body = copy.deepcopy(example())
    body["spec"]["exposure"] = {"auth": True, "tls": "edge"}
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "arbiter.dev", "v1alpha1", namespace, "decisionmodels", body, dry_run="All")
        raise AssertionError("auth: true with tls: edge was admitted")
    except client.ApiException as exc:
        status, message = exc.status, json.loads(exc.body)["message"]
    assert status == 422 and "spec.exposure.tls" in message and "reencrypt" in message, message
    body["spec"]["exposure"] = {"auth": False, "tls": "edge"}
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "arbiter.dev", "v1alpha1", namespace, "decisionmodels", body, dry_run="All")


def test_a_hand_made_route_under_the_name_is_not_exposure(control_plane, namespace, api, operator_process,
                                                          predictors):
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "route.openshift.io", "v1", namespace, "routes",
        {"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": DM},
         "spec": {"to": {"kind": "Service", "name": "somewhere-else"}}})
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())

    def judged():
        d = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM) or {}
        c = condition(d, "Exposed") or {}
        return d if c.get("reason") == "RouteNotOwned" else None

    d = eventually(judged, 90, "Exposed=False/RouteNotOwned")
    exposed = condition(d, "Exposed")
    assert exposed["status"] == "False" and f"Route {namespace}/{DM}" in exposed["message"], exposed
    assert condition(d, "Ready")["status"] == "False"
    route = get(api, "route.openshift.io/v1", "routes", namespace, DM)
    assert route["spec"]["to"]["name"] == "somewhere-else"  # never written to
