"""Stand-in for one version's predictor pod, as Prometheus sees it: vLLM's and the Arbiter runtime's metrics.

No GPU or vLLM here, so this process serves synthetic traffic whose rate, latency and error share the test sets
through `POST /control` (JSON: {"rps": 50, "latency_ms": 40, "error_rate": 0.0}). Metric names, types, labels and
bucket boundaries are the real ones (vLLM's `vllm:e2e_request_latency_seconds` and the runtime's `arbiter_*`). Every
decided request gets a label from one fixed cycle (MIX), so every stand-in pod shows the same decision mix, as two
versions that decide alike would.

Run: python tests/support/prom_workload.py --port 0 --model m --version v1   (prints the port it listens on)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# vLLM's bucket boundaries for e2e request latency.
VLLM_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
# The runtime's decision latency buckets: fine enough for SLAs of tens to hundreds of milliseconds.
DECISION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
# The labels decided requests get, in turn: 35% approve, 35% review, 30% deny.
MIX = ("approve", "review", "deny") * 6 + ("approve", "review")


class Workload:
    def __init__(self, model: str, version: str) -> None:
        self.model, self.version = model, version
        self.registry = CollectorRegistry()
        self.vllm_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            ["model_name"],
            buckets=VLLM_E2E_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "arbiter_decisions", "Decisions served.", ["model", "version", "outcome", "source"], registry=self.registry
        )
        self.latency = Histogram(
            "arbiter_decision_latency_seconds",
            "Decision latency in seconds.",
            ["model", "version"],
            buckets=DECISION_BUCKETS,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "arbiter_upstream_errors", "Failed calls to vLLM.", ["model", "version"], registry=self.registry
        )
        self.labels = Counter(
            "arbiter_decision_labels", "Decisions answered, by final label.", ["model", "version", "label"],
            registry=self.registry,
        )
        for label in set(MIX):  # the runtime pre-creates every configured label's series at 0
            self.labels.labels(model, version, label)
        self._decided = 0
        self.lock = threading.Lock()
        self.rps, self.latency_s, self.error_rate = 0.0, 0.04, 0.0
        self._carry = 0.0
        self._errors_carry = 0.0

    def control(self, rps: float | None = None, latency_ms: float | None = None, error_rate: float | None = None):
        with self.lock:
            if rps is not None:
                self.rps = float(rps)
            if latency_ms is not None:
                self.latency_s = float(latency_ms) / 1000.0
            if error_rate is not None:
                self.error_rate = float(error_rate)

    def tick(self, dt: float) -> None:
        with self.lock:
            self._carry += self.rps * dt
            n = int(self._carry)
            self._carry -= n
            for _ in range(n):
                self._errors_carry += self.error_rate
                failed = self._errors_carry >= 1.0
                if failed:
                    self._errors_carry -= 1.0
                    self.upstream_errors.labels(self.model, self.version).inc()
                outcome = "error" if failed else "decided"
                self.decisions.labels(self.model, self.version, outcome, "model").inc()
                if not failed:
                    self.labels.labels(self.model, self.version, MIX[self._decided % len(MIX)]).inc()
                    self._decided += 1
                self.latency.labels(self.model, self.version).observe(self.latency_s)
                self.vllm_e2e.labels(self.model).observe(self.latency_s * 0.8)

    def run_traffic(self, stop: threading.Event, period: float = 0.05) -> None:
        last = time.monotonic()
        while not stop.wait(period):
            now = time.monotonic()
            self.tick(now - last)
            last = now


def serve(workload: Workload, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: Prometheus scrapes every second
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body = generate_latest(workload.registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            else:
                body = b"ok\n"
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            data = json.loads(self.rfile.read(length) or b"{}")
            workload.control(**data)
            self.send_response(204)
            self.end_headers()

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> None:
    """One process, many pods: `POST /targets {"model": m, "version": v}` on the control port starts another
    stand-in pod on its own port and answers {"port": N}. Optional --model/--version start one at once."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model")
    ap.add_argument("--version")
    args = ap.parse_args(argv)
    stop = threading.Event()

    def start_target(model: str, version: str) -> int:
        wl = Workload(model, version)
        server = serve(wl, 0)
        threading.Thread(target=wl.run_traffic, args=(stop,), daemon=True).start()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server.server_address[1]

    class Control(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            data = json.loads(self.rfile.read(length) or b"{}")
            body = json.dumps({"port": start_target(data["model"], data["version"])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    control = ThreadingHTTPServer(("127.0.0.1", args.port), Control)
    first = start_target(args.model, args.version) if args.model and args.version else None
    print(control.server_address[1], first or "", flush=True)
    try:
        control.serve_forever()
    finally:
        stop.set()


if __name__ == "__main__":
    main(sys.argv[1:])
