"""spec.access.network rendered, judged by what the NetworkPolicy admits (support/netpol.py reads it as the API
defines it): the peers listed, the router, the monitoring stack, the model's own pods only while they call each other,
and nobody else; no NetworkPolicy without spec.access.network."""

from __future__ import annotations

import pytest
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.render.networkpolicy import render_networkpolicy
from pydantic import ValidationError
from support.netpol import Pod, admits
from support.plannerdrive import two_versions

NS = "team"
PREDICTOR = Pod(NS, {"arbiter.dev/decision-model": "credit-limit", "arbiter.dev/component": "predictor",
                     "arbiter.dev/version": "1.0.0", "app": "isvc.credit-limit--1-0-0-predictor"},
                ports={"http1": 8080, "https": 8443})
ROUTER = Pod("openshift-ingress", {"ingresscontroller.operator.openshift.io/deployment-ingresscontroller": "default"},
             {"kubernetes.io/metadata.name": "openshift-ingress", "policy-group.network.openshift.io/ingress": ""})
PROMETHEUS = Pod("openshift-user-workload-monitoring", {"app.kubernetes.io/name": "prometheus"},
                 {"network.openshift.io/policy-group": "monitoring"})
PRICING = Pod("finance", {"app": "pricing"}, {"kubernetes.io/metadata.name": "finance"})
FINANCE_BATCH = Pod("finance", {"app": "batch"}, {"kubernetes.io/metadata.name": "finance"})
RISK = Pod("risk", {"app": "scoring"}, {"kubernetes.io/metadata.name": "risk", "team": "risk"})
NEIGHBOUR = Pod(NS, {"app": "something-else"}, {"kubernetes.io/metadata.name": NS})
OTHER_VERSION = Pod(NS, {**PREDICTOR.labels, "arbiter.dev/version": "1.1.0"}, {"kubernetes.io/metadata.name": NS})


def _dm(network: dict | None, nodes: int = 1) -> DecisionModel:
    body = two_versions()
    body["spec"]["access"] = {"groups": ["finance"], **({"network": network} if network is not None else {})}
    if nodes > 1:
        body["spec"]["serving"].update(nodes=nodes, replicas=1)
        for v in body["spec"]["versions"]:
            v["storageUri"] = "pvc://models/credit"
    return DecisionModel.model_validate(body)


NETWORK = {"from": [{"namespace": "finance", "podLabels": {"app": "pricing"}}, {"namespaceLabels": {"team": "risk"}}]}


def test_the_listed_peers_and_what_must_reach_the_pods_are_admitted_and_nobody_else():
    policy = render_networkpolicy(_dm(NETWORK), peers_call_each_other=False)
    assert policy is not None and policy["metadata"]["name"] == "credit-limit-predictors"
    policies = [policy]
    for source in (PRICING, RISK, ROUTER):
        assert admits(policies, source, PREDICTOR, 8080) and admits(policies, source, PREDICTOR, 8443), source
    assert admits(policies, PROMETHEUS, PREDICTOR, 8080)  # the scrape
    assert not admits(policies, PROMETHEUS, PREDICTOR, 8443)
    for source in (FINANCE_BATCH, NEIGHBOUR, OTHER_VERSION):
        assert not admits(policies, source, PREDICTOR, 8080), source
    assert not admits(policies, PRICING, PREDICTOR, 8000)  # vLLM's port is the pod's own
    assert admits(policies, RISK, NEIGHBOUR, 1234)  # other pods of the namespace are not isolated by it


def test_the_model_own_pods_only_while_they_call_each_other():
    calling = [render_networkpolicy(_dm(NETWORK), peers_call_each_other=True)]
    assert admits(calling, OTHER_VERSION, PREDICTOR, 8080)
    assert not admits(calling, OTHER_VERSION, PREDICTOR, 22)
    ray = [render_networkpolicy(_dm(NETWORK, nodes=2), peers_call_each_other=False)]
    assert admits(ray, OTHER_VERSION, PREDICTOR, 6379)  # a multi-node predictor is one Ray cluster


def test_no_network_no_policy_and_an_empty_list_admits_only_what_must():
    assert render_networkpolicy(_dm(None), peers_call_each_other=False) is None
    closed = [render_networkpolicy(_dm({"from": []}), peers_call_each_other=False)]
    assert admits(closed, ROUTER, PREDICTOR, 8443) and not admits(closed, PRICING, PREDICTOR, 8080)


@pytest.mark.parametrize("peer", [{"namespace": "Finance"}, {"podLabels": {"": "x"}},
                                  {"namespace": "a", "extra": 1}])
def test_malformed_peers_are_refused(peer):
    with pytest.raises(ValidationError):
        _dm({"from": [peer]})
