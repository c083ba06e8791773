"""spec.routing on the real stack: a context pinned to a version keeps being decided by that version through a
promotion of the default; after the stable Service moves, the new stable version's runtime forwards the context,
with the caller's token, to the pinned version's runtime, which checks the caller (the real apiserver's reviews) and
decides; the audit record is the deciding version's. Other contexts follow the default (support/governance_kit.py
says what plays the pods, kube-proxy, the kubelet and cluster DNS)."""

from __future__ import annotations

import pytest
from support.governance_kit import V1, V2
from support.identities import service_account_token

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

UNDERWRITING = {"x-decision-context": "underwriting"}
CLAIMS = {"x-decision-context": "claims"}


def test_a_pinned_context_keeps_deciding_on_its_version_through_a_promotion_of_the_default(governed):
    g = governed
    caller = service_account_token(g.api, g.ns, "pricing-app")
    stranger = service_account_token(g.api, g.ns, "stranger")
    for v in (V1, V2):
        g.start_runtime(v)
    g.create(spec={"access": {"serviceAccounts": [{"name": "pricing-app"}]},
                   "routing": {"contexts": [{"header": "x-decision-context", "value": "underwriting",
                                             "version": V1}]}},
             rollbackWindowSeconds=0)
    g.set_fate(V1, "ready")
    g.wait(lambda: g.stable_version() == V1 and g.live_file(V2, "routing.json") is None
           and g.live_file(V1, "routing.json"), "1.0.0 serving, its routes written")

    def decided_by(headers: dict[str, str], token: str = caller) -> str:
        g.sync_live_files("routing.json")
        status, body = g.via_stable(token, headers)
        assert status == 200, (status, body)
        return body["version"]

    assert decided_by(UNDERWRITING) == V1 and decided_by(CLAIMS) == V1
    g.patch_spec({"promote": {"version": V2}})
    g.set_fate(V2, "ready")
    g.wait(lambda: g.stable_version() == V2 and g.promotion().get("phase") == "Idle", "1.1.0 stable")
    g.wait(lambda: g.live_file(V2, "routing.json"), "1.1.0's routes written")
    assert g.isvcs() == {V1, V2}  # no rollback window, yet 1.0.0 stays warm: a context is pinned to it

    def pinned_on_v1() -> bool:
        return decided_by(UNDERWRITING) == V1

    g.wait(pinned_on_v1, "the new stable version forwards underwriting to 1.0.0", timeout=20)  # runtimes re-read
    status, body = g.via_stable(stranger, UNDERWRITING)
    assert status == 403, body  # judged before anything is forwarded

    # Each decision is recorded once, by the version that made it: forwarded ones by 1.0.0 for the caller.
    def decisions(version: str) -> list[dict]:
        return [r for r in g.procs[version].records() if r.get("kind") == "arbiter.decision"]

    before = {v: len(decisions(v)) for v in (V1, V2)}
    assert [decided_by(UNDERWRITING) for _ in range(3)] == [V1] * 3
    assert decided_by(CLAIMS) == V2 and decided_by({}) == V2  # other contexts follow the default
    g.wait(lambda: {v: len(decisions(v)) - before[v] for v in (V1, V2)} == {V1: 3, V2: 2}, "the audit records")
    assert {r["version"] for r in decisions(V1)} == {V1} and {r["version"] for r in decisions(V2)} == {V2}
    assert decisions(V1)[-1]["caller"] == f"system:serviceaccount:{g.ns}:pricing-app"

    # Unpinned: 1.0.0 is retired like any version out of use, and its routes go.
    g.patch_spec({"routing": None})
    g.wait(lambda: g.isvcs() == {V2} and g.live_file(V2, "routing.json") is None, "1.0.0 retired")
