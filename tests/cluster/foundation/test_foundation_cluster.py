"""The local cluster beyond the apiserver: controller-manager, scheduler, kwok's simulated GPU nodes and pod fates,
KServe's webhooks (arbiter_devenv: cluster.py, kwok.py, kserve.py)."""

from __future__ import annotations

import time

import pytest
from arbiter_devenv import _procs
from arbiter_devenv.cluster import LocalCluster, NodePool
from arbiter_devenv.kwok import A100, H100
from kubernetes import client
from support.polling import eventually

pytestmark = pytest.mark.cluster


@pytest.fixture
def api(control_plane):
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


def _deployment(name: str, gpus: int, product: str = A100) -> dict:
    labels = {"app": name, "serving.kserve.io/inferenceservice": name}
    return {"metadata": {"name": name}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [{"name": "kserve-container", "image": "registry.example/none:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def _pod(api, namespace, name):
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={name}").items
    return pods[0] if pods else None


def test_default_pools_carry_gpu_feature_discovery_labels(api):
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    a100 = [n for n in nodes.values() if n.metadata.labels.get("nvidia.com/gpu.product") == A100]
    assert len(a100) >= 4
    for n in a100:
        assert n.metadata.labels["nvidia.com/gpu.count"] == "8"
        assert n.status.allocatable["nvidia.com/gpu"] == "8"
        assert next(c for c in n.status.conditions if c.type == "Ready").status == "True"  # kwok keeps it Ready
    assert any("nvidia.com/gpu" not in (n.status.allocatable or {}) for n in nodes.values())  # CPU nodes


def test_pods_are_scheduled_by_gpus_and_run(api, namespace):
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(namespace, _deployment("fits", 8))
    apps.create_namespaced_deployment(namespace, _deployment("too-big", 16))
    pod = eventually(lambda: (p := _pod(api, namespace, "fits")) and p.status.phase == "Running" and p, 60, "Running")
    assert next(c for c in pod.status.conditions if c.type == "Ready").status == "True"
    assert client.CoreV1Api(api).read_node(pod.spec.node_name).metadata.labels["nvidia.com/gpu.product"] == A100
    big = eventually(lambda: (p := _pod(api, namespace, "too-big")) and p.status.conditions and p, 60, "scheduled")
    scheduled = next(c for c in big.status.conditions if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in scheduled.message


def test_added_pool_takes_pods_that_ask_for_its_product(control_plane, api, namespace):
    control_plane.add_pool(NodePool("h100", 1, gpus=8, gpu_product=H100))
    client.AppsV1Api(api).create_namespaced_deployment(namespace, _deployment("on-h100", 4, H100))
    pod = eventually(lambda: (p := _pod(api, namespace, "on-h100")) and p.status.phase == "Running" and p, 60, "run")
    assert pod.spec.node_name == "h100-0"


@pytest.mark.parametrize("fate,reason", [("crashloop", "Error"), ("oom", "OOMKilled")])
def test_fates_crash_the_serving_container(control_plane, api, namespace, fate, reason):
    control_plane.set_fate(namespace, "doomed", fate)
    client.AppsV1Api(api).create_namespaced_deployment(namespace, _deployment("doomed", 1))

    def crashed():
        pod = _pod(api, namespace, "doomed")
        cs = (pod and pod.status.container_statuses) or []
        return cs and cs[0].restart_count >= 1 and cs[0].last_state.terminated and cs[0]

    cs = eventually(crashed, 60, "a crash")
    assert cs.state.waiting.reason == "CrashLoopBackOff" and not cs.ready
    assert cs.last_state.terminated.reason == reason

    control_plane.set_fate(namespace, "doomed", "ready")  # fixed: the replacement pod becomes ready
    eventually(lambda: (p := _pod(api, namespace, "doomed")) and p.status.container_statuses
                and p.status.container_statuses[0].ready, 60, "ready after the fix")


def test_loading_fate_runs_but_never_gets_ready(control_plane, api, namespace):
    control_plane.set_fate(namespace, "slow", "loading")
    client.AppsV1Api(api).create_namespaced_deployment(namespace, _deployment("slow", 1))
    pod = eventually(lambda: (p := _pod(api, namespace, "slow")) and p.status.phase == "Running" and p, 60, "Running")
    time.sleep(3)  # a measured wait: the pod must stay unready for a while, not become Ready late
    pod = _pod(api, namespace, "slow")
    assert next(c for c in pod.status.conditions if c.type == "Ready").status == "False"


def test_namespaces_get_a_default_service_account_and_can_be_deleted(api):
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "doomed-ns"}})
    eventually(lambda: any(s.metadata.name == "default"
                           for s in core.list_namespaced_service_account("doomed-ns").items),
               30, "default ServiceAccount")
    core.create_namespaced_config_map("doomed-ns", {"metadata": {"name": "x"}})
    core.delete_namespace("doomed-ns")
    eventually(lambda: "doomed-ns" not in {n.metadata.name for n in core.list_namespace().items}, 60, "gone")


def test_kserve_webhooks_are_registered_with_the_devenv_ca(control_plane, api):
    adm = client.AdmissionregistrationV1Api(api)
    mutating = {h.name: h for w in adm.list_mutating_webhook_configuration().items for h in w.webhooks}
    validating = {h.name for w in adm.list_validating_webhook_configuration().items for h in w.webhooks}
    assert "inferenceservice.kserve-webhook-server.pod-mutator" in mutating
    assert "inferenceservice.kserve-webhook-server.defaulter" in mutating
    assert {"inferenceservice.kserve-webhook-server.validator", "servingruntime.kserve-webhook-server.validator"} \
        <= validating
    hook = mutating["inferenceservice.kserve-webhook-server.defaulter"]
    assert hook.client_config.url.startswith("https://127.0.0.1:")
    cm = client.CoreV1Api(api).read_namespaced_config_map("inferenceservice-config", "kserve")
    assert '"disableIngressCreation": true' in cm.data["ingress"]
    assert '"storageSpecSecretName": "storage-config"' in cm.data["credentials"]


def test_stopping_a_cluster_leaves_no_process(tmp_path):
    cluster = LocalCluster(kserve=False, pools=(NodePool("a100", 1, gpus=8, gpu_product=A100),)).start()
    pids = list(cluster.pids.values())
    assert len(pids) == 5  # etcd, kube-apiserver, controller-manager, scheduler, kwok
    cluster.stop()
    assert _procs.wait_gone(pids, 20) == []
