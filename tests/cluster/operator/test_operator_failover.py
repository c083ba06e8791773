"""Two operator replicas with leader election on a real apiserver that writes an audit log: the leader is SIGKILLed
while a DecisionModel's version is still loading, the standby takes the Lease and finishes the rollout, and the audit
log shows that no replica wrote anything while it did not hold the Lease."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from arbiter_devenv import crds
from arbiter_devenv.cluster import LocalCluster
from arbiter_devenv.operator_process import OperatorProcess
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get, seed_model_storage

DM, ISVC = "credit-limit", "credit-limit--1-0-0"
LEASE_NS = "arbiter-system"
LEASE = "arbiter-operator-leader"

# Every write by anyone, at Metadata level (who, what, when, with which User-Agent); reads are not recorded.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Iterator[tuple[LocalCluster, Path]]:
    workdir = tmp_path_factory.mktemp("failover")
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    log = workdir / "audit.log"
    cluster = LocalCluster(extra_apiserver_args=(
        f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-mode=blocking",
        "--audit-log-format=json",
    ))
    cluster.start()
    try:
        api = cluster.api_client()
        try:
            crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=False)
            crds.install_crds(api, crds.arbiter_crd_paths())
        finally:
            api.close()
        yield cluster, log
    finally:
        cluster.stop()


def _namespace(api: client.ApiClient, name: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: core.read_namespaced_service_account("default", name), 60, f"{name}'s default ServiceAccount")


def _identity(op: OperatorProcess) -> str:
    found = eventually(lambda: re.search(r"leader election on: Lease \S+, identity (\S+)", op.log()), 60, "identity")
    return found.group(1)


def _holder(api: client.ApiClient) -> dict[str, Any]:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, LEASE_NS)
    except client.ApiException:
        return {}
    return {"holder": lease.spec.holder_identity, "acquired": lease.spec.acquire_time}


def _writes(audit_log: Path, user_agent: str) -> list[tuple[float, str, str]]:
    """(received, verb, resource) of every completed write sent with this User-Agent."""
    out = []
    for line in audit_log.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("stage") != "ResponseComplete" or ev.get("userAgent") != user_agent:
            continue
        ts = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        ref = ev.get("objectRef") or {}
        sub = "/" + ref["subresource"] if ref.get("subresource") else ""
        out.append((ts, ev["verb"], ref.get("resource", "") + sub))
    return out


def test_standby_takes_over_a_rollout_from_a_killed_leader_and_only_the_leader_writes(audited, s3_server, tmp_path):
    cluster, audit_log = audited
    api = cluster.api_client()
    ns = "failover"
    _namespace(api, LEASE_NS)
    _namespace(api, ns)
    seed_model_storage(s3_server, api, ns)
    cluster.set_fate(ns, ISVC, "loading")  # the version stays loading: the rollout is in progress when we strike

    args = ("--leader-elect", "--leader-election-namespace", LEASE_NS)
    first = OperatorProcess(cluster.kubeconfig, [ns], extra_args=args, log_dir=tmp_path / "a", metrics=True).start()
    second = None
    try:
        first_id = _identity(first)
        eventually(lambda: _holder(api).get("holder") == first_id, 30, "the first replica holds the Lease")
        second = OperatorProcess(cluster.kubeconfig, [ns], extra_args=args, log_dir=tmp_path / "b",
                                 metrics=True).start()
        second_id = _identity(second)
        assert "arbiter_operator_leader 1.0" in first.scrape()
        assert "arbiter_operator_leader 0.0" in second.scrape()

        create_dm(api, ns, example())
        # In progress: the leader created the InferenceService and reports it loading (Ready False, Reconciling).
        eventually(lambda: get(api, "serving.kserve.io/v1beta1", "inferenceservices", ns, ISVC), 60, "ISVC")

        def loading():
            dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM)
            c = condition(dm, "Reconciling")
            return c and c["status"] == "True"

        eventually(loading, 60, "Reconciling while the version loads")
        assert not second.writes(), "the standby wrote"

        first.kill()  # SIGKILL: no release of the Lease, like a node loss
        killed = time.time()
        cluster.set_fate(ns, ISVC, "ready")
        eventually(lambda: _holder(api).get("holder") == second_id, 60, "the standby takes the Lease")
        takeover = time.time() - killed
        # The standby waits out one lease duration (15 s by default) of an unrenewed Lease, then takes it at its
        # next retry (2 s).
        assert takeover < 15 + 2 * 2 + 3, takeover
        print(f"\ntakeover after SIGKILL of the leader: {takeover:.1f}s")

        def ready():
            dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM)
            c = condition(dm, "Ready")
            return dm if c and c["status"] == "True" else None

        eventually(ready, 90, "the new leader finishes the rollout: Ready")
        assert "arbiter_operator_leader 1.0" in second.scrape()

        acquired = _holder(api)["acquired"].timestamp()
        first_writes = _writes(audit_log, f"arbiter-operator/{first_id}")
        second_writes = _writes(audit_log, f"arbiter-operator/{second_id}")
        # Both replicas did real work: the first started the rollout, the second finished it.
        assert any(r.startswith("inferenceservices") for _, _, r in first_writes), first_writes
        assert any(r == "decisionmodels/status" for _, _, r in second_writes), second_writes
        # No write from a non-leader: the first wrote nothing after it was killed, the second nothing before it
        # took the Lease (not even to the Lease: a standby only reads it). One second of slack for the timestamps'
        # resolution and the apiserver's clock against ours.
        assert all(ts <= killed + 1 for ts, _, _ in first_writes)
        early = [w for w in second_writes if w[0] < acquired - 1]
        assert not early, early
    finally:
        first.stop()
        if second is not None:
            second.stop()
        api.close()
