"""A real Prometheus (Debian's `prometheus` package) scraping workload stand-ins every second.

Each stand-in is a target with the labels OpenShift user-workload monitoring attaches to a predictor pod's target
(`namespace`, `pod`, `container`) plus the pod labels the PodMonitor copies with `podTargetLabels`
(`arbiter.dev/decision-model` -> `arbiter_dev_decision_model`, `arbiter.dev/version` -> `arbiter_dev_version`,
`serving.kserve.io/inferenceservice` -> `serving_kserve_io_inferenceservice`).
Used by tests/cluster/promotion and benchmarks/promotion_overhead.py.

Real decision-server processes (tests/support/runtime_procs.py) are scraped too, once registered with
`add_runtime(proc)`: both of a predictor pod's endpoints, `/metrics` (job `arbiter-runtimes`) and `/metrics/vllm`
(job `arbiter-runtimes-vllm`), under the same pod labels.

Operator processes are scraped as the chart's ServiceMonitor does (job `arbiter-metrics`, `add_operator`); rule files
are loaded with `add_rules` (Prometheus re-reads them on SIGHUP). A stand-in for NVIDIA's DCGM exporter
(`DcgmStandIn`, the real metric name and the pod labels the exporter's Kubernetes mode attaches) reports GPU
utilisation for the pods `add_gpu_pod` names.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


class DcgmStandIn:
    """Serves `DCGM_FI_DEV_GPU_UTIL` (percent, per GPU) for registered pods, labelled as NVIDIA's DCGM exporter labels
    a GPU in use by a pod (`namespace`, `pod`, `container`, `gpu`, `UUID`, `Hostname`). Stands in for the exporter,
    which needs a GPU and NVIDIA's driver."""

    def __init__(self) -> None:
        self.gpus: dict[str, tuple[dict[str, str], float]] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
                for labels, util in list(stand_in.gpus.values()):
                    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {util}")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, namespace: str, pod: str, util: float) -> None:
        key = f"{namespace}/{pod}"
        n = str(len(self.gpus))
        labels = self.gpus[key][0] if key in self.gpus else {
            "namespace": namespace, "pod": pod, "container": "kserve-container", "gpu": n,
            "UUID": f"GPU-stand-in-{n}", "Hostname": "kwok-gpu-node"}
        self.gpus[key] = (labels, util)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
    operators: dict[str, int] = field(default_factory=dict)  # operator processes' metrics ports, by namespace
    dcgm: DcgmStandIn | None = None


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

    def add_operator(self, key: str, port: int) -> None:
        """Scrape an operator's metrics (job `arbiter-metrics`, the chart's metrics Service name for release
        `arbiter`)."""
        self.operators[key] = port
        self._write_sd()

    def remove_operator(self, key: str) -> None:
        self.operators.pop(key, None)
        self._write_sd()

    def add_gpu_pod(self, namespace: str, pod: str, util: float) -> None:
        assert self.dcgm is not None
        self.dcgm.set(namespace, pod, util)

    def add_rules(self, name: str, groups: list[dict[str, Any]], timeout: float = 30.0) -> None:
        """Load rule groups (as a PrometheusRule's spec.groups) and wait until Prometheus evaluates them."""
        rules = self.workdir / "rules"
        rules.mkdir(exist_ok=True)
        (rules / f"{name}.yaml.tmp").write_text(yaml.safe_dump({"groups": groups}))
        (rules / f"{name}.yaml.tmp").replace(rules / f"{name}.yaml")
        assert self.prometheus is not None
        self.prometheus.send_signal(signal.SIGHUP)
        wanted = {g["name"] for g in groups}
        deadline = time.monotonic() + timeout
        while True:
            with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=5) as resp:
                loaded = {g["name"] for g in json.load(resp)["data"]["groups"]}
            if wanted <= loaded:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not load rule groups {sorted(wanted - loaded)}")
            time.sleep(0.2)

    def _write_sd(self) -> None:
        groups = [{"targets": [f"127.0.0.1:{t.port}"], "labels": t.labels()} for t in self.targets.values()]
        runtimes = [{"targets": [f"127.0.0.1:{port}"], "labels": labels} for port, labels in self.runtimes.values()]
        operators = [{"targets": [f"127.0.0.1:{port}"],
                      "labels": {"namespace": "arbiter-system", "pod": f"arbiter-operator-{key}"}}
                     for key, port in self.operators.items()]
        for name, content in (("targets.json", groups), ("runtimes.json", runtimes), ("operators.json", operators)):
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
        self.dcgm = DcgmStandIn()
        port = _free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.workdir / "rules" / "*.yaml")],
            "scrape_configs": [
                {
                    "job_name": "arbiter-metrics",
                    "scrape_interval": "1s",
                    # As the chart's ServiceMonitor: the per-DecisionModel labels as the operator exports them.
                    "honor_labels": True,
                    "file_sd_configs": [{"files": [str(self.workdir / "operators.json")], "refresh_interval": "1s"}],
                },
                {
                    "job_name": "dcgm-exporter",
                    "scrape_interval": "1s",
                    "honor_labels": True,  # as the GPU operator's ServiceMonitor: the pod's namespace and name
                    "static_configs": [{"targets": [f"127.0.0.1:{self.dcgm.port}"]}],
                },
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
        if self.dcgm is not None:
            self.dcgm.stop()
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
