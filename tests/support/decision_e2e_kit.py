"""End-to-end harness for decision-aware promotion: e2e_kit's real operator and cluster, with every version's predictor
pod played by a REAL decision-server process (tests/support/runtime_procs.py: `python -m arbiter_runtime serve` in
front of a stand-in upstream that misbehaves on demand), scraped by the real Prometheus under the pod's labels.

Two things a cluster does that nothing here does are played by `ConfigMapSync`, in the open:
- the kubelet: a mounted ConfigMap's files change in the pod when the ConfigMap changes. The sync copies the
  operator's `shadow.json` from each version's decision ConfigMap (as the apiserver holds it) next to that version's
  process's decision.json, and removes it when the operator does;
- cluster DNS: the URL the operator writes (`http://<isvc>-predictor.<ns>.svc.cluster.local`) is checked to be that
  one exactly, then pointed at the candidate process's loopback address.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from arbiter_operator.api.models import isvc_name
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.e2e_kit import E2E, V1, V2, G, P, V
from support.plannerdrive import two_versions
from support.runtime_procs import RuntimeFleet, RuntimeProc, Traffic

RPS = 8.0  # decisions per second per version: 40 per 5 s window, over minRequests=20


class ConfigMapSync:
    """Kubelet + cluster DNS stand-in for shadow.json (see the module docstring)."""

    def __init__(self, e: DecisionE2E):
        self.e = e
        self.core = client.CoreV1Api(e.api)
        self.seen: list[tuple[str, dict[str, Any] | None]] = []  # (version whose ConfigMap, shadow config or None)
        self.errors: list[str] = []
        self._current: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="configmap-sync")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            for version, proc in list(self.e.procs.items()):
                try:
                    self._sync(version, proc)
                except Exception as exc:
                    self.errors.append(f"{version}: {type(exc).__name__}: {exc}")

    def _sync(self, version: str, proc: RuntimeProc) -> None:
        name = f"{isvc_name(self.e.name, version)}-decision"
        try:
            cm = self.core.read_namespaced_config_map(name, self.e.ns)
            text = (cm.data or {}).get("shadow.json")
        except ApiException as exc:
            if exc.status != 404:
                raise
            text = None
        if text == self._current.get(version):
            return
        self._current[version] = text
        if text is None:
            proc.clear_shadow()
            self.seen.append((version, None))
            return
        cfg = json.loads(text)
        candidate = self.e.procs[cfg["candidate"]]
        want = f"http://{isvc_name(self.e.name, cfg['candidate'])}-predictor.{self.e.ns}.svc.cluster.local"
        if cfg["url"] != want:
            raise AssertionError(f"shadow.json url {cfg['url']!r}, expected {want!r}")
        proc.write_shadow(candidate, sample_rate=cfg["sampleRate"], timeout_ms=cfg["timeoutMs"],
                          max_in_flight=cfg["maxInFlight"])
        self.seen.append((version, cfg))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class DecisionE2E(E2E):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fleet = RuntimeFleet(self.workdir / f"runtimes-{self.ns}", namespace=self.ns, model=self.name)
        self.procs: dict[str, RuntimeProc] = {}
        self.traffic: Traffic | None = None
        self.sync = ConfigMapSync(self)

    def create(self, promote_version: str = V1, candidate: str = "healthy", **promote: Any) -> None:
        """The DecisionModel, and both versions' decision servers (the candidate's upstream behaving as told),
        each called RPS times a second and scraped by Prometheus."""
        for version, behaviour in ((V1, "healthy"), (V2, candidate)):
            proc = self.fleet.start_version(version, behaviour=behaviour)
            self.procs[version] = proc
            self.stack.add_runtime(proc)
        self.traffic = self.fleet.traffic({p: RPS for p in self.procs.values()})
        body = two_versions(promote_version, **promote)
        body["metadata"] = {"name": self.name, "namespace": self.ns}
        self.objs.create_namespaced_custom_object(G, V, self.ns, P, body)

    def pod_checksum(self, version: str) -> str | None:
        isvc = self.isvcs().get(version) or {}
        return ((isvc.get("spec") or {}).get("predictor") or {}).get("annotations", {}).get(
            "arbiter.dev/decision-config-checksum")

    def shadow_json(self, version: str) -> str | None:
        """The version's shadow.json as the apiserver holds it; None without one (or without the ConfigMap)."""
        return decision_file(self.api, self.ns, self.name, version, "shadow.json")

    def close(self) -> None:
        self.sync.stop()
        for proc in self.procs.values():
            self.stack.remove_runtime(proc)
        self.fleet.stop()
        super().close()


def decision_file(api: Any, ns: str, model: str, version: str, key: str) -> str | None:
    """A key of a version's decision ConfigMap (decision.json, shadow.json, routing.json) as the apiserver holds it;
    None without the key or the ConfigMap."""
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(f"{isvc_name(model, version)}-decision", ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return (cm.data or {}).get(key)
