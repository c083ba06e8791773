"""spec.access on the real stack: the operator's Role and RoleBinding decide who may call, as the runtime's real
auth path (TokenReview and SubjectAccessReview against the real apiserver) judges every request, before, during and
after a promotion; its NetworkPolicy admits, by its rules as the apiserver stores them, the namespace listed and what
must reach the predictor pods (their labels as the apiserver holds them: no network plugin enforces traffic here);
and the promotion's history names who asked for it (support/governance_kit.py says what plays the pods, kube-proxy
and the kubelet)."""

from __future__ import annotations

import uuid

import pytest
from arbiter_operator.api.models import isvc_name
from kubernetes import client
from support.governance_kit import V1, V2, Governed
from support.identities import service_account_token
from support.netpol import Pod, admits

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def finance(control_plane):
    """A caller's namespace (listed in spec.access.network) and an unlisted one, on the real apiserver."""
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    names = [f"finance-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"]
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield names
    finally:
        for name in names:
            core.delete_namespace(name, propagation_policy="Background")
        api.close()


def network_verdicts(g: Governed, version: str, finance: str, other: str) -> dict[str, bool]:
    """Who the stored NetworkPolicies admit to the version's predictor pods (kwok's, as KServe made them)."""
    core = client.CoreV1Api(g.api)
    policies = [client.ApiClient().sanitize_for_serialization(p)
                for p in client.NetworkingV1Api(g.api).list_namespaced_network_policy(g.ns).items]
    pods = core.list_namespaced_pod(g.ns, label_selector=f"serving.kserve.io/inferenceservice="
                                                         f"{isvc_name(g.name, version)}").items
    assert pods, f"no predictor pod of {version}"

    def ns_labels(name: str) -> dict[str, str]:
        return core.read_namespace(name).metadata.labels or {}

    router = Pod("openshift-ingress", {"app": "router"}, {"policy-group.network.openshift.io/ingress": ""})
    sources = {"finance": Pod(finance, {"app": "pricing"}, ns_labels(finance)),
               "other": Pod(other, {"app": "pricing"}, ns_labels(other)),
               "same-namespace": Pod(g.ns, {"app": "curious"}, ns_labels(g.ns)),
               "router": router}
    verdicts: dict[str, bool] = {}
    for pod in pods:
        target = Pod(g.ns, pod.metadata.labels or {}, ns_labels(g.ns), {"http1": 8080, "https": 8443})
        for name, source in sources.items():
            verdicts[name] = verdicts.get(name, True) and admits(policies, source, target, 8080)
    return verdicts


def test_a_listed_caller_decides_through_every_promotion_step_and_an_unlisted_one_never(governed, finance):
    g = governed
    listed, unlisted = finance
    caller = service_account_token(g.api, g.ns, "pricing-app")
    stranger = service_account_token(g.api, g.ns, "stranger")
    for v in (V1, V2):
        g.start_runtime(v)
    g.create(spec={"access": {"serviceAccounts": [{"name": "pricing-app"}],
                              "network": {"from": [{"namespace": listed}]}}},
             approval="Required", rollbackWindowSeconds=0)
    g.set_fate(V1, "ready")
    g.wait(lambda: g.promotion().get("phase") == "Idle" and g.stable_version() == V1, "1.0.0 serving")

    def judged(where: str, versions: tuple[str, ...]) -> None:
        # Through the stable Service, and on each version the Route sends traffic to.
        assert g.via_stable(caller)[0] == 200, (where, g.via_stable(caller))
        status, body = g.via_stable(stranger)
        assert status == 403 and f"system:serviceaccount:{g.ns}:stranger" in body["error"], (where, body)
        for v in versions:
            assert g.procs[v].call({"amount": 5, "country": "PL"}, {"Authorization": f"Bearer {caller}"})[0] == 200
            assert g.procs[v].call({"amount": 5, "country": "PL"}, {"Authorization": f"Bearer {stranger}"})[0] == 403

    judged("before", (V1,))
    expected = {"finance": True, "other": False, "same-namespace": False, "router": True}
    assert g.wait(lambda: network_verdicts(g, V1, listed, unlisted) == expected and True, "the NetworkPolicy")
    g.patch_spec({"promote": {"version": V2}}, manager="release-pipeline")
    g.set_fate(V2, "ready")
    g.wait(lambda: g.promotion().get("phase") == "Paused", "1.1.0 ready, waiting for approval")
    judged("during", (V1, V2))
    g.annotate("arbiter.dev/approve", V2)
    g.wait(lambda: g.stable_version() == V2 and g.isvcs() == {V2}, "1.1.0 stable, 1.0.0 retired")
    judged("after", (V2,))
    assert network_verdicts(g, V2, listed, unlisted) == expected  # one policy for every version's pods
    # The grant names exactly the versions live now.
    role = client.RbacAuthorizationV1Api(g.api).read_namespaced_role(f"{g.name}-callers", g.ns)
    assert role.rules[0].resource_names == [f"{g.name}--1-1-0"] and role.rules[0].verbs == ["get"]

    # Who asked, in the history: the pipeline's field manager and the spec's generation.
    promotion = g.promotion()
    record = promotion["history"][-1]
    assert (record["version"], record["outcome"], record.get("requestedBy"), record.get("generation")) == (
        V2, "Succeeded", "release-pipeline", 2), promotion

    # A caller taken off the list is refused once the runtime's verdict cache (1 s here, 10 s by default) expires.
    g.patch_spec({"access": {"serviceAccounts": [{"name": "someone-else"}]}})
    g.wait(lambda: g.via_stable(caller)[0] == 403, "the removed caller refused", timeout=30)
