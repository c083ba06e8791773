"""Runtime test helpers: the decision server as a real HTTP server on loopback, configs, V2 bodies."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import time
from typing import Any

import httpx
import uvicorn
from arbiter_devenv.vllm_standin import free_port
from arbiter_runtime.audit import StdoutSink
from arbiter_runtime.config import parse_config
from arbiter_runtime.server import create_app
from arbiter_runtime.service import RuntimeOptions
from prometheus_client.parser import text_string_to_metric_families

LABELS = ["approve", "deny", "review"]
CODES = ["income_ok", "debt_high", "thin_file"]


def base_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    cfg = {
        "model": "credit",
        "version": "v1",
        "labels": LABELS,
        "reasoningCodes": CODES,
        "steps": 2,
        "trajectoryMode": "scored",
        "confidenceThreshold": 0.5,
        "lowConfidencePolicy": "flag",
        "deadlineMs": 3000,
        "inputSchema": {
            "type": "object",
            "properties": {"amount": {"type": "number", "minimum": 0},
                           "country": {"type": "string", "minLength": 2, "maxLength": 2},
                           "applicant": {"type": "object", "properties": {"age": {"type": "integer"}},
                                         "required": ["age"]}},
            "required": ["amount", "country"],
            "additionalProperties": False,
        },
        "outputSchema": {},
        "fallbackRules": [
            {"name": "large-amount", "when": "input.amount > 10000.0", "decision": "deny",
             "reasoningCode": "debt_high"},
            {"name": "default", "when": "true", "decision": "review", "reasoningCode": "thin_file"},
        ],
        "sla": {"p95LatencyMs": 150},
        "diffusion": False,
        "upstream": {"url": upstream_url, "servedModelName": "credit-v1", "maxRetries": 2},
    }
    cfg.update(overrides)
    return cfg


class ListSink:
    """Audit records kept in memory as decoded objects (the fuzz reads them by the thousand)."""

    def __init__(self):
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)

    async def close(self, deadline: float) -> int:
        return 0  # nothing it took is left unwritten


class RuntimeServer:
    """create_app() behind a real uvicorn on a free port, in a thread; the audit goes to an in-memory stream."""

    def __init__(self, raw_cfg: dict[str, Any], options: RuntimeOptions | None = None,
                 engines: tuple[str, ...] = ()):
        """engines: the vLLM engines' base URLs when the pod runs several (`serve --upstream` once each)."""
        self.stdout = io.StringIO()
        self.options = options or RuntimeOptions()
        if self.options.audit_sinks is None:
            self.options.audit_sinks = [StdoutSink(self.stdout)]
        self.options.upstream_poll_s = 0.05
        cfg = parse_config(raw_cfg)
        if engines:
            cfg = dataclasses.replace(cfg, upstream=dataclasses.replace(cfg.upstream, url=engines[0],
                                                                        engines=engines))
        self.app = create_app(cfg, self.options)
        self.runtime = self.app.state.runtime
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, lifespan="on",
                                                     log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self, wait_ready: bool = True) -> RuntimeServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("decision server failed to start")
            if time.monotonic() > deadline:
                raise RuntimeError("decision server did not start")
            time.sleep(0.01)
        while wait_ready and not self.runtime.ready:
            if time.monotonic() > deadline or self.runtime.fatal:
                raise RuntimeError(f"decision server not ready: {self.runtime.not_ready_reason}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)

    def records(self) -> list[dict[str, Any]]:
        if self.runtime.audit is not None:
            assert self.runtime.audit.wait_written(10), "audit writer did not catch up"
        return [json.loads(line) for line in self.stdout.getvalue().splitlines() if line]

    def records_since(self, n: int) -> list[dict[str, Any]]:
        """Records after the first n, from a ListSink (the first sink)."""
        sink = self.options.audit_sinks[0]
        if self.runtime.audit is not None:
            assert self.runtime.audit.wait_written(10), "audit writer did not catch up"
        return [json.loads(line) for line in sink.lines[n:]]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


def v2_body(*documents: Any, **extra: Any) -> dict[str, Any]:
    data = [json.dumps(d) for d in documents]
    return {"inputs": [{"name": "input", "shape": [len(data)], "datatype": "BYTES", "data": data}], **extra}


def outputs(body: dict[str, Any]) -> dict[str, Any]:
    return {o["name"]: o for o in body["outputs"]}


def scrape(server) -> dict[tuple[str, frozenset], float]:
    with server.client() as c:
        text = c.get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series(samples, name: str, **labels: str) -> dict[frozenset, float]:
    """Every sample of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {k: v for (n, k), v in samples.items() if n == name and want <= set(k)}


def value(samples, name: str, **labels: str) -> float:
    found = [v for (n, k), v in samples.items() if n == name and set(k) == set(labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} series"
    return found[0]
