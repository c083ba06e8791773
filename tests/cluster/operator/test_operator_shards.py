"""Sharding by namespace label on the real apiserver: two operators, each with its own selector and leader Lease,
start before any namespace matches, take up the namespaces labelled into their shard without restarting, reconcile
only those, and hand a namespace over when its label moves it to the other shard."""

from __future__ import annotations

import re
import uuid

from arbiter_operator.kube.shard import membership_change
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get, seed_model_storage

DM = "credit-limit"
LABEL = "arbiter.dev/test-shard"


def _ready(api, ns):
    dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM)
    c = condition(dm, "Ready") if dm else None
    return c and c["status"] == "True"


def _namespace(core, name, labels=None):
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    eventually(lambda: core.read_namespaced_service_account("default", name), 60, f"{name}'s default ServiceAccount")


def _wrote_to(op, ns):
    return [line for line in op.writes() if f" {ns}/" in line]


def test_two_shards_split_the_fleet_by_namespace_label(control_plane, s3_server, api, operator_process, tmp_path):
    core = client.CoreV1Api(api)
    run = uuid.uuid4().hex[:8]
    lease_ns, ns_a, ns_b = f"t-{run}-leases", f"t-{run}-a", f"t-{run}-b"
    created = [lease_ns]
    _namespace(core, lease_ns)
    try:
        shards = {}
        for shard in ("a", "b"):
            # Started while no namespace matches: the operator is live (its probe answers) and waits.
            shards[shard] = operator_process(extra_args=(
                "--namespace-selector", f"{LABEL}={run}-{shard}", "--leader-elect",
                "--leader-election-namespace", lease_ns, "--leader-election-id", f"arbiter-{run}-{shard}",
            ))
        first_pids = {s: op.proc.pid for s, op in shards.items()}
        for shard, ns in (("a", ns_a), ("b", ns_b)):
            _namespace(core, ns, {LABEL: f"{run}-{shard}"})
            created.append(ns)
            seed_model_storage(s3_server, api, ns)
            create_dm(api, ns, example())
        for ns in (ns_a, ns_b):
            eventually(lambda ns=ns: _ready(api, ns), 180, f"{ns} Ready")

        # Each shard took up its namespace in the same process, holds its own Lease, and wrote only there.
        assert {s: op.proc.pid for s, op in shards.items()} == first_pids
        assert all(op.proc.poll() is None for op in shards.values())
        for shard, op in shards.items():
            assert re.search(rf"shard '{LABEL}={run}-{shard}' owns namespaces t-{run}-{shard}\b", op.log())
        assert _wrote_to(shards["a"], ns_a) and not _wrote_to(shards["a"], ns_b)
        assert _wrote_to(shards["b"], ns_b) and not _wrote_to(shards["b"], ns_a)
        leases = {le.metadata.name: le.spec.holder_identity
                  for le in client.CoordinationV1Api(api).list_namespaced_lease(lease_ns).items}
        assert set(leases) == {f"arbiter-{run}-a", f"arbiter-{run}-b"} and all(leases.values())

        # The namespace b is relabelled into shard a: shard a now repairs what is edited there, shard b no longer.
        core.patch_namespace(ns_b, {"metadata": {"labels": {LABEL: f"{run}-a"}}})
        eventually(lambda: re.search(rf"shard '{LABEL}={run}-a' owns namespaces t-{run}-a, t-{run}-b\b",
                                     shards["a"].log()), 60, "shard a owns both namespaces")
        eventually(lambda: re.search(rf"no namespace matches '{LABEL}={run}-b'", shards["b"].log()), 60,
                   "shard b owns nothing")
        b_writes = len(shards["b"].writes())
        custom = client.CustomObjectsApi(api)
        custom.patch_namespaced_custom_object("route.openshift.io", "v1", ns_b, "routes", DM,
                                              {"spec": {"to": {"kind": "Service", "name": "elsewhere", "weight": 100}}})
        eventually(lambda: get(api, "route.openshift.io/v1", "routes", ns_b, DM)["spec"]["to"]["name"] != "elsewhere",
                   60, "Route restored by shard a")
        assert any(" Route " in line for line in _wrote_to(shards["a"], ns_b))
        assert len(shards["b"].writes()) == b_writes
        assert {s: op.proc.pid for s, op in shards.items()} == first_pids
    finally:
        for ns in created:
            try:
                core.delete_namespace(ns, propagation_policy="Background")
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


def test_which_namespace_events_change_what_a_shard_owns():
    owned = {"risk-a", "risk-b"}
    assert membership_change(owned, "ADDED", "risk-c")  # labelled into the shard, or created with the label
    assert not membership_change(owned, "MODIFIED", "risk-a")  # an owned namespace edited (a mesh label, say)
    assert membership_change(owned, "DELETED", "risk-a")  # labelled out of the shard, or deleted
    assert not membership_change(owned, "DELETED", "elsewhere")
    assert not membership_change(owned, "BOOKMARK", "risk-c") and not membership_change(owned, "ERROR", "risk-a")
