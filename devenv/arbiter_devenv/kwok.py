"""Simulated nodes and pod lifecycles with kwok (sigs.k8s.io/kwok): GPU node pools that the real scheduler places
pods on, and pods that become Running/Ready, never ready, or crash-loop, as the test asks.

kwok runs with ``--enable-crds=Stage``: every lifecycle rule is a ``Stage`` object in the cluster (kwok's own "fast"
stages for nodes and pods), so a test steers a predictor by creating a Stage, not by writing pod status itself.

Fates (``set_fate``), selected per InferenceService by the label KServe puts on its pods
(``serving.kserve.io/inferenceservice``):

- ``ready``: the default; kwok's pod-ready stage (all containers running and ready, init containers completed);
- ``loading``: Running, containers running but never ready (a model that never finishes loading);
- ``crashloop``: the serving container has exited with code 1 (``Error``), was restarted, and waits in
  ``CrashLoopBackOff`` (restart count 1 or more, never ready);
- ``oom``: the same with ``OOMKilled`` / exit code 137 (out of memory while loading).

A fate stage outweighs the default stages, so kwok always picks it for the pods it selects. Changing a fate deletes
the InferenceService's pods; their ReplicaSet creates new ones, which follow the new fate (a restart, as a user would
do it). Pods already ready are kept when the new fate is ``ready``: they already follow it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import time
from typing import Any

from . import _procs
from .crds import GoModuleFiles, install_crds

__all__ = [
    "DEFAULT_POOLS",
    "FATES",
    "KWOK",
    "Kwok",
    "NodePool",
    "add_pool",
    "default_stages",
    "fate_stage",
    "node_manifest",
    "set_fate",
]

KWOK = GoModuleFiles(
    "sigs.k8s.io/kwok",
    "v0.8.0",
    (
        "kustomize/crd/bases/kwok.x-k8s.io_stages.yaml",
        "kustomize/stage/node/fast/node-initialize.yaml",
        "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
        "kustomize/stage/pod/fast/pod-ready.yaml",
        "kustomize/stage/pod/fast/pod-complete.yaml",
        "kustomize/stage/pod/fast/pod-delete.yaml",
    ),
)
STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL = "kwok.x-k8s.io", "v1alpha1", "stages"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
FATES = ("ready", "loading", "crashloop", "oom")
GPU = "nvidia.com/gpu"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


@dataclasses.dataclass(frozen=True)
class NodePool:
    """``count`` identical nodes ``<name>-0`` .. ``<name>-<count-1>``; GPU nodes bear GPU Feature Discovery labels."""

    name: str
    count: int
    gpus: int = 0
    gpu_product: str = ""
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110


DEFAULT_POOLS = (
    NodePool("a100", 4, gpus=8, gpu_product=A100, cpu="128", memory="1Ti"),
    NodePool("cpu", 2, cpu="32", memory="128Gi"),
)


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    name = f"{pool.name}-{index}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "arbiter.dev/node-pool": pool.name,
    }
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    if pool.gpus:
        # What NVIDIA GPU Feature Discovery publishes on a GPU node.
        labels.update({
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": pool.gpu_product,
            "nvidia.com/gpu.count": str(pool.gpus),
        })
        resources[GPU] = str(pool.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # kwok manages nodes with this annotation (see Kwok's --manage-nodes-with-annotation-selector).
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {"allocatable": dict(resources), "capacity": dict(resources)},
    }


def add_pool(api_client: Any, pool: NodePool) -> list[str]:
    """Create the pool's nodes (kwok initialises them: Ready, addresses, heartbeats). Returns the node names."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    names = []
    for i in range(pool.count):
        body = node_manifest(pool, i)
        try:
            core.create_node(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        names.append(body["metadata"]["name"])
    return names


def _load_yaml(path: pathlib.Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def default_stages() -> list[dict[str, Any]]:
    """kwok's own stages: node initialisation and lease heartbeats, pod ready / complete / delete."""
    return [_load_yaml(p) for p in KWOK.paths()[1:]]


def _fate_selector(namespace: str, isvc: str) -> list[dict[str, Any]]:
    return [
        {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
        {"key": f'.metadata.labels["{ISVC_LABEL}"]', "operator": "In", "values": [isvc]},
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
    ]


_POD_ADDRESSES = """
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
"""

_INIT_DONE = """
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
"""

# A pod whose serving container is not ready: the kubelet's conditions, then each container's status begins.
_UNREADY = """conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }},
   message: "containers with unready status: [kserve-container]"}
- {type: ContainersReady, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }},
   message: "containers with unready status: [kserve-container]"}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
"""

_LOADING = """
{{ $now := Now }}
""" + _UNREADY + """  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
""" + _INIT_DONE + _POD_ADDRESSES + """
phase: Running
startTime: {{ $now | Quote }}
"""

# The serving container terminated and is held back: what the kubelet shows as CrashLoopBackOff with the last
# termination's reason and exit code, and the restart count one higher than before.
_CRASH = """
{{ $now := Now }}
{{ $restarts := 0 }}
{{ range .status.containerStatuses }}{{ if eq .name "kserve-container" }}{{ $restarts = .restartCount }}{{ end }}{{ end }}
""" + _UNREADY + """  started: false
  restartCount: {{ add1 $restarts }}
  state:
    waiting:
      reason: CrashLoopBackOff
      message: {{ printf "back-off restarting failed container %s" .name | Quote }}
  lastState:
    terminated:
      exitCode: __EXIT__
      reason: __REASON__
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
""" + _INIT_DONE + _POD_ADDRESSES + """
phase: Running
startTime: {{ $now | Quote }}
"""


def fate_stage(namespace: str, isvc: str, fate: str) -> dict[str, Any] | None:
    """The Stage that gives the pods of InferenceService ``namespace/isvc`` their fate (None for ``ready``)."""
    if fate not in FATES:
        raise ValueError(f"fate must be one of {FATES}, not {fate!r}")
    if fate == "ready":
        return None
    selector = _fate_selector(namespace, isvc)
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        # Outweighs kwok's default stages (weight 0): when both match, kwok always picks this one.
        "weight": 10000,
    }
    if fate == "loading":
        # Once: a Pending pod starts and stays unready. (The default stages only act on Pending pods.)
        selector.append({"key": ".status.phase", "operator": "In", "values": ["Pending"]})
        spec["next"] = {"statusTemplate": _LOADING}
    else:
        reason, code = ("OOMKilled", "137") if fate == "oom" else ("Error", "1")
        selector.append({"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]})
        # After a short start (kept short so tests see the crash within seconds).
        spec["delay"] = {"durationMilliseconds": 3000, "jitterDurationMilliseconds": 1000}
        spec["next"] = {"statusTemplate": _CRASH.replace("__EXIT__", code).replace("__REASON__", reason)}
    spec["selector"] = {"matchExpressions": selector}
    return {
        "apiVersion": f"{STAGE_GROUP}/{STAGE_VERSION}",
        "kind": "Stage",
        "metadata": {"name": _fate_name(namespace, isvc), "labels": {"arbiter.dev/kwok-fate": fate}},
        "spec": spec,
    }


def _fate_name(namespace: str, isvc: str) -> str:
    return "fate-" + hashlib.sha256(f"{namespace}/{isvc}".encode()).hexdigest()[:16]


def set_fate(api_client: Any, namespace: str, isvc: str, fate: str) -> None:
    """Give InferenceService ``namespace/isvc``'s predictor pods ``fate`` (see the module docstring); pods that
    already exist are deleted so that their replacements follow it."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    stage = fate_stage(namespace, isvc, fate)
    name = _fate_name(namespace, isvc)
    try:
        custom.delete_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    if stage is not None:
        custom.create_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, stage)
    # kwok reads Stages through a watch; give it a moment before the replacement pods appear.
    time.sleep(0.3)
    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{ISVC_LABEL}={isvc}").items
    for pod in pods:
        # A pod that is already ready has the fate `ready` (e.g. created after the old fate's Stage went): deleting
        # it would take a serving version's only replica away for a moment, which no user action here stands for.
        if fate == "ready" and _pod_ready(pod):
            continue
        try:
            core.delete_namespaced_pod(pod.metadata.name, namespace)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def _pod_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status is not None else None) or []
    return pod.metadata.deletion_timestamp is None and any(c.type == "Ready" and c.status == "True" for c in conditions)


class Kwok:
    """The kwok controller against a cluster (``kubeconfig``), with its Stage CRD and kwok's default stages."""

    def __init__(self, kubeconfig: os.PathLike[str] | str, workdir: pathlib.Path) -> None:
        self.kubeconfig = pathlib.Path(kubeconfig)
        self.workdir = workdir
        self._proc: Any = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, api_client: Any) -> Kwok:
        from kubernetes import client

        from .tools import ensure_tool

        binary = ensure_tool("kwok")
        install_crds(api_client, KWOK.paths()[:1])
        custom = client.CustomObjectsApi(api_client)
        for stage in default_stages():
            try:
                custom.create_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, stage)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        # kwok reads ~/.kwok/kwok.yaml when present; an empty home keeps a user's own kwok settings out.
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)
        self._proc = _procs.spawn(
            [
                str(binary),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--enable-crds=Stage",
                "--cidr=10.244.0.1/16",
                "--node-ip=10.245.0.1",
                "--node-lease-duration-seconds=40",
            ],
            log_path=self.workdir / "kwok.log",
            env={**os.environ, "HOME": str(home)},
        )
        return self

    def check(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            log = (self.workdir / "kwok.log").read_text(errors="replace")
            raise RuntimeError(f"kwok exited with code {self._proc.returncode}:\n" + "\n".join(log.splitlines()[-20:]))

    def stop(self) -> None:
        _procs.terminate(self._proc)
        self._proc = None
