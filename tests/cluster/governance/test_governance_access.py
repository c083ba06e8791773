"""spec.access on the real stack: the operator's Role and RoleBinding decide who may call, as the runtime's real
auth path (TokenReview and SubjectAccessReview against the real apiserver) judges every request, before, during and
after a promotion; and the promotion's history names who asked for it (support/governance_kit.py says what plays
the pods, kube-proxy and the kubelet)."""

from __future__ import annotations

import pytest
from support.governance_kit import V1, V2, Governed
from support.identities import service_account_token

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def governed(control_plane, namespace, s3_server, tmp_path):
    g = Governed(control_plane, namespace, s3_server, tmp_path)
    g.operator.start()
    try:
        yield g
    finally:
        g.close()


def test_a_listed_caller_decides_through_every_promotion_step_and_an_unlisted_one_never(governed):
    g = governed
    caller = service_account_token(g.api, g.ns, "pricing-app")
    stranger = service_account_token(g.api, g.ns, "stranger")
    for v in (V1, V2):
        g.start_runtime(v)
    g.create(spec={"access": {"serviceAccounts": [{"name": "pricing-app"}]}},
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
    g.patch_spec({"promote": {"version": V2}}, manager="release-pipeline")
    g.set_fate(V2, "ready")
    g.wait(lambda: g.promotion().get("phase") == "Paused", "1.1.0 ready, waiting for approval")
    judged("during", (V1, V2))
    g.annotate("arbiter.dev/approve", V2)
    g.wait(lambda: g.stable_version() == V2 and g.isvcs() == {V2}, "1.1.0 stable, 1.0.0 retired")
    judged("after", (V2,))
    # The grant names exactly the versions live now.
    from kubernetes import client

    role = client.RbacAuthorizationV1Api(g.api).read_namespaced_role(f"{g.name}-callers", g.ns)
    assert role.rules[0].resource_names == [f"{g.name}--1-1-0"] and role.rules[0].verbs == ["get"]

    # Who asked, in the history: the pipeline's field manager and the spec's generation.
    record = g.promotion()["history"][-1]
    assert (record["version"], record["outcome"], record["requestedBy"], record["generation"]) == (
        V2, "Succeeded", "release-pipeline", 2), record

    # A caller taken off the list is refused once the runtime's verdict cache (1 s here, 10 s by default) expires.
    g.patch_spec({"access": {"serviceAccounts": [{"name": "someone-else"}]}})
    g.wait(lambda: g.via_stable(caller)[0] == 403, "the removed caller refused", timeout=30)
