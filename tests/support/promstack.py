"""A real Prometheus (Debian's `prometheus` package) scraping workload stand-ins every second.

Each stand-in is a target with the labels OpenShift user-workload monitoring attaches to a predictor pod's target
(`namespace`, `pod`, `container`) plus the pod labels the PodMonitor copies with `podTargetLabels`
(`arbiter.dev/decision-model` -> `arbiter_dev_decision_model`, `arbiter.dev/version` -> `arbiter_dev_version`,
`serving.kserve.io/inferenceservice` -> `serving_kserve_io_inferenceservice`).
Used by tests/cluster/promotion and benchmarks/promotion_overhead.py.

Real decision-server processes (tests/support/runtime_procs.py) are scraped too, once registered with
`add_runtime(proc)`: both of a predictor pod's endpoints, `/metrics` (job `arbiter-runtimes`) and `/metrics/vllm`
(job `arbiter-runtimes-vllm`), under the same pod labels.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from arbiter_operator.api.models import isvc_name

WORKLOAD = Path(__file__).with_name("prom_workload.py")


def prometheus_binary() -> str | None:
    return os.environ.get("ARBITER_PROMETHEUS") or shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float = 30.0, insecure: bool = False) -> None:
    import ssl

    ctx = ssl._create_unverified_context() if insecure else None  # readiness only; the tests verify TLS themselves
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout}s")
        time.sleep(0.1)


@dataclass
class Target:
    namespace: str
    model: str
    version: str
    port: int

    def control(self, **settings: float) -> None:
        """Set the stand-in pod's traffic: rps, latency_ms, error_rate."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/control",
            data=json.dumps(settings).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=5).close()

    def labels(self) -> dict[str, str]:
        isvc = isvc_name(self.model, self.version)
        return {
            "namespace": self.namespace,
            "pod": f"{isvc}-predictor-5d9f7c-abcde",
            "container": "kserve-container",
            "arbiter_dev_decision_model": self.model,
            "arbiter_dev_version": self.version,
            "serving_kserve_io_inferenceservice": isvc,
        }


@dataclass
class PromStack:
    """Start with start(); add stand-in pods any time with add_workload() (Prometheus picks them up through
    file-based service discovery within a second or two)."""

    workdir: Path
    targets: dict[str, Target] = field(default_factory=dict)
    prometheus: subprocess.Popen | None = None
    workloads: subprocess.Popen | None = None
    control_port: int = 0
    url: str = ""
    tls: tuple[Path, Path] | None = None  # (cert, key): serve HTTPS, as Thanos Querier does
    runtimes: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)  # real runtime processes


    def add_workload(self, namespace: str, model: str, version: str) -> Target:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}/targets",
            data=json.dumps({"model": model, "version": version}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            port = json.load(resp)["port"]
        target = Target(namespace, model, version, port)
        self.targets[f"{namespace}/{model}/{version}"] = target
        self._write_sd()
        return target

    def target(self, namespace: str, model: str, version: str) -> Target:
        return self.targets[f"{namespace}/{model}/{version}"]

    def add_runtime(self, proc) -> None:
        """Scrape a real decision server (runtime_procs.RuntimeProc: `port`, `labels()`) like a predictor pod."""
        self.runtimes[f"{proc.labels()['namespace']}/{proc.model}/{proc.version}"] = (proc.port, proc.labels())
        self._write_sd()

    def remove_runtime(self, proc) -> None:
        self.runtimes.pop(f"{proc.labels()['namespace']}/{proc.model}/{proc.version}", None)
        self._write_sd()

    def _write_sd(self) -> None:
        groups = [{"targets": [f"127.0.0.1:{t.port}"], "labels": t.labels()} for t in self.targets.values()]
        runtimes = [{"targets": [f"127.0.0.1:{port}"], "labels": labels} for port, labels in self.runtimes.values()]
        for name, content in (("targets.json", groups), ("runtimes.json", runtimes)):
            tmp = self.workdir / f"{name}.tmp"
            tmp.write_text(json.dumps(content))
            tmp.replace(self.workdir / name)  # atomic: Prometheus never reads half a file

    def start(self) -> PromStack:
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus not found: apt-get install prometheus (hack/setup.sh does)")
        self.workloads = subprocess.Popen([sys.executable, str(WORKLOAD)], stdout=subprocess.PIPE, text=True)
        assert self.workloads.stdout is not None
        self.control_port = int(self.workloads.stdout.readline().split()[0])
        self._write_sd()
        port = _free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "arbiter-predictors",
                    "scrape_interval": "1s",
                    "file_sd_configs": [{"files": [str(self.workdir / "targets.json")], "refresh_interval": "1s"}],
                },
                *({
                    "job_name": job,
                    "scrape_interval": "1s",
                    "metrics_path": path,
                    "file_sd_configs": [{"files": [str(self.workdir / "runtimes.json")], "refresh_interval": "1s"}],
                } for job, path in (("arbiter-runtimes", "/metrics"), ("arbiter-runtimes-vllm", "/metrics/vllm"))),
            ],
        }
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        if self.tls:
            web = self.workdir / "web.yml"
            web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(self.tls[0]),
                                                                  "key_file": str(self.tls[1])}}))
            argv.append(f"--web.config.file={web}")
        log = open(self.workdir / "prometheus.log", "w")
        self.prometheus = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        _wait_http(f"{self.url}/-/ready", insecure=bool(self.tls))
        return self

    def stop(self) -> None:
        for p in (self.prometheus, self.workloads):
            if p is not None:
                p.terminate()
        for p in (self.prometheus, self.workloads):
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def module_stack():  # type: ignore[no-untyped-def]
    """A module's `stack` fixture: the session's one real Prometheus (`prometheus_stack`, tests/conftest.py).

    Tests that use it register their stand-ins under their own namespace (the `namespace` fixture), so one Prometheus
    serves them all; a module whose queries name a fixed namespace starts a PromStack of its own.
    """
    import pytest

    # Session scope, like what it hands out: the module's tests need not stay on one pytest-xdist worker.
    @pytest.fixture(scope="session")
    def stack(prometheus_stack):  # type: ignore[no-untyped-def]
        return prometheus_stack

    return stack
