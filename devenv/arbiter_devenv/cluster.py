"""A small real cluster without containers: the control plane (etcd + kube-apiserver) plus kube-controller-manager,
kube-scheduler, kwok's simulated nodes and pod lifecycles, and the real KServe controller with its webhooks.

    with LocalCluster() as cluster:             # default pools: 4 A100 nodes (8 GPUs each) + 2 CPU nodes
        cluster.add_pool(NodePool("h100", 2, gpus=8, gpu_product=H100))
        cluster.set_fate("ns", "credit--1-0-0", "crashloop")

It offers the ``ControlPlane`` interface (``kubeconfig``, ``server``, ``ca_file``, ``api_client()``,
``write_kubeconfig()``, ``pids``, ``stop()``), so fixtures and tools written for the bare control plane keep working.
Each part's log lies in ``workdir`` (``kube-controller-manager.log``, ``kube-scheduler.log``, ``kwok.log``,
``kserve-controller.log``). ``python -m arbiter_devenv.cluster`` starts one and prints its kubeconfig.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import _procs
from .controlplane import ControlPlane, serve_until_interrupted
from .kserve import KSERVE_0_17, KServeController, KServeLine
from .kwok import DEFAULT_POOLS, Kwok, NodePool, add_pool, set_fate
from .tools import ensure_tool

__all__ = ["USERS", "LocalCluster", "NodePool", "wait_default_service_account"]

# The user name each component authenticates as (its client certificate's common name).
USERS = {
    "kcm": "system:kube-controller-manager",
    "scheduler": "system:kube-scheduler",
    "kwok": "kwok-controller",
    "kserve": "kserve-controller-manager",
}


def wait_default_service_account(api_client: Any, namespace: str, timeout: float = 30.0) -> None:
    """Wait until the controller-manager has created ``namespace``'s ``default`` ServiceAccount: the ServiceAccount
    admission plugin rejects pods before that."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except client.ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


class LocalCluster:
    """See the module docstring. ``kserve=False`` leaves KServe out (nodes and workloads only); ``kserve_line`` picks
    another KServe release (``arbiter_devenv.kserve.KSERVE_0_15``)."""

    def __init__(self, *, pools: Sequence[NodePool] = DEFAULT_POOLS, kserve: bool = True,
                 workdir: os.PathLike[str] | str | None = None, extra_apiserver_args: tuple[str, ...] = (),
                 kserve_line: KServeLine = KSERVE_0_17) -> None:
        self.control_plane = ControlPlane(workdir=workdir, extra_apiserver_args=extra_apiserver_args)
        self.pools = list(pools)
        self.with_kserve = kserve
        self.kserve_line = kserve_line
        self._kcm: Any = None
        self._scheduler: Any = None
        self.kwok: Kwok | None = None
        self.kserve: KServeController | None = None
        self.timings: dict[str, float] = {}

    # -- the ControlPlane interface ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> pathlib.Path | None:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def ca_file(self) -> pathlib.Path | None:
        return self.control_plane.ca_file

    @property
    def workdir(self) -> pathlib.Path | None:
        return self.control_plane.workdir

    @property
    def pids(self) -> dict[str, int]:
        out = dict(self.control_plane.pids)
        for name, proc in (("kube-controller-manager", self._kcm), ("kube-scheduler", self._scheduler)):
            if proc is not None:
                out[name] = proc.pid
        if self.kwok is not None and self.kwok.pid:
            out["kwok"] = self.kwok.pid
        if self.kserve is not None and self.kserve.pid:
            out["kserve-controller"] = self.kserve.pid
        return out

    def api_client(self) -> Any:
        return self.control_plane.api_client()

    def write_kubeconfig(self, path: os.PathLike[str] | str, **kw: Any) -> pathlib.Path:
        return self.control_plane.write_kubeconfig(path, **kw)

    def issue_serving_certificate(self, directory: os.PathLike[str] | str, name: str = "tls") -> Any:
        return self.control_plane.issue_serving_certificate(directory, name)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        # Build (or find cached) every binary first, so a cold build is not mistaken for a slow start.
        kserve = [self.kserve_line.tool] if self.with_kserve else []
        for tool in ("kube-controller-manager", "kube-scheduler", "kwok", *kserve):
            ensure_tool(tool)
        _procs.register(self, self.stop)
        try:
            started = time.monotonic()
            self.control_plane.start()
            self.timings["control-plane"] = time.monotonic() - started
            assert self.workdir is not None and self.kubeconfig is not None
            pki = self.workdir / "pki"
            # Each component has its own client certificate (cluster-admin through system:masters), so the apiserver's
            # audit log tells their requests apart from the operator's.
            kcfg = {user: str(self.control_plane.write_client_kubeconfig(self.workdir / f"{user}.kubeconfig", user))
                    for user in USERS.values()}
            kc = kcfg[USERS["kcm"]]
            self._kcm = _procs.spawn(
                [
                    str(ensure_tool("kube-controller-manager")),
                    f"--kubeconfig={kc}",
                    f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}",
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                    "--leader-elect=false",
                    # ServiceAccount tokens signed with the apiserver's key; kube-root-ca.crt from the devenv CA.
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
                    # Scale benchmarks create hundreds of objects at once; the defaults (20/50 QPS) throttle them.
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--concurrent-deployment-syncs=10",
                    "--concurrent-replicaset-syncs=10",
                    "--profiling=false",
                ],
                log_path=self.workdir / "kube-controller-manager.log",
            )
            kc = kcfg[USERS["scheduler"]]
            self._scheduler = _procs.spawn(
                [
                    str(ensure_tool("kube-scheduler")),
                    f"--kubeconfig={kc}",
                    f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}",
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                    "--leader-elect=false",
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--profiling=false",
                ],
                log_path=self.workdir / "kube-scheduler.log",
            )
            api = self.api_client()
            try:
                started = time.monotonic()
                self.kwok = Kwok(kcfg[USERS["kwok"]], self.workdir).start(api)
                for pool in self.pools:
                    add_pool(api, pool)
                self.timings["kwok"] = time.monotonic() - started
                if self.with_kserve:
                    started = time.monotonic()
                    self.kserve = KServeController(self.workdir, self.kserve_line).start(
                        self.control_plane, api, kcfg[USERS["kserve"]])
                    self.timings["kserve"] = time.monotonic() - started
                self._check()
                started = time.monotonic()
                self._wait_default_service_account(api)
                self.timings["controller-manager"] = time.monotonic() - started
            finally:
                api.close()
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.kserve is not None:
            self.kserve.stop()
            self.kserve = None
        if self.kwok is not None:
            self.kwok.stop()
            self.kwok = None
        _procs.terminate(self._scheduler)
        self._scheduler = None
        _procs.terminate(self._kcm)
        self._kcm = None
        _procs.unregister(self)
        self.control_plane.stop()

    def _check(self) -> None:
        assert self.workdir is not None
        for name, proc in (("kube-controller-manager", self._kcm), ("kube-scheduler", self._scheduler)):
            if proc is not None and proc.poll() is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")
                raise RuntimeError(f"{name} exited with code {proc.returncode}:\n" + "\n".join(log.splitlines()[-20:]))
        if self.kwok is not None:
            self.kwok.check()
        if self.kserve is not None:
            self.kserve.check()

    def _wait_default_service_account(self, api: Any, timeout: float = 60.0) -> None:
        """The controller-manager is working once it has created the ``default`` ServiceAccount of ``default``."""
        from kubernetes import client

        core = client.CoreV1Api(api)
        deadline = time.monotonic() + timeout
        while True:
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except client.ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise RuntimeError("kube-controller-manager did not create ServiceAccount default/default: "
                                       f"{exc.reason}") from exc
            self._check()
            time.sleep(0.2)

    # -- what tests steer ------------------------------------------------------------------------------------------
    def add_pool(self, pool: NodePool) -> list[str]:
        """More simulated nodes, e.g. ``NodePool("h100", 2, gpus=8, gpu_product=H100)`` or a 4-GPU pool."""
        api = self.api_client()
        try:
            return add_pool(api, pool)
        finally:
            api.close()

    def set_fate(self, namespace: str, isvc: str, fate: str) -> None:
        """ready | loading | crashloop | oom for the predictor pods of InferenceService ``namespace/isvc``."""
        api = self.api_client()
        try:
            set_fate(api, namespace, isvc, fate)
        finally:
            api.close()


def main() -> int:
    return serve_until_interrupted(LocalCluster(), "cluster")


if __name__ == "__main__":
    sys.exit(main())
