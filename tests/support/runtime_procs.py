"""Real decision-server processes per model version, each with a stand-in upstream that can be told to misbehave.

For tests (and benchmarks) that need what a cluster's predictor pods would expose: `python -m arbiter_runtime serve`
with a decision.json (and a shadow.json next to it), in front of `python -m arbiter_devenv.vllm_standin` (the vLLM
stand-in), on loopback. Prometheus can scrape each process (`metrics_url`, `vllm_metrics_url`) under the labels a
predictor pod's target carries (`labels()`, the same as tests/support/promstack.py's `Target.labels()`;
`PromStack.add_runtime(proc)` registers one).

API
---
    fleet = RuntimeFleet(workdir, namespace="ns", model="credit")     # or `with RuntimeFleet(...) as fleet:`
    v1 = fleet.start_version("v1")                                   # healthy, ready when it returns
    v2 = fleet.start_version("v2", behaviour="approve_all", confidenceThreshold=0.5)  # decision.json overrides
    v3 = fleet.start_version("v3", env={"ARBITER_AUTH": "true", ...})  # more of the server's environment
    v2.misbehave("fallback")        # any time; BEHAVIOURS below
    v1.write_shadow(v2, sample_rate=1.0, timeout_ms=2000, max_in_flight=64)  # v1 mirrors to v2 (no restart)
    v1.write_shadow_raw("{not json")  # a malformed shadow.json (serving continues; shadowing off)
    v1.clear_shadow()               # removes shadow.json: shadowing off
    traffic = fleet.traffic({v1: 20, v2: 20})   # background callers, decisions/s per process; traffic.set(v2, 0)
    v1.decide({"amount": 120, "country": "DE"}) -> the /v1/decisions answer (dict)
    v1.call(doc, headers={...}) -> (status, body): any answer (401/403/503 included)
    v1.infer([doc, ...]) -> the V2 infer answer (dict)
    v1.metrics_text(), v1.records() (audit records), v1.url, v1.port, v1.metrics_url, v1.vllm_metrics_url
    v1.labels() -> {"namespace", "pod", "container", "arbiter_dev_decision_model", "arbiter_dev_version",
                    "serving_kserve_io_inferenceservice"}
    fleet.stop()                    # stops the traffic and every process it started (also on context exit)

BEHAVIOURS (what the stand-in upstream of one version does; the decision server itself is never changed):
    healthy        answers every case, confidently (on CASES: 2 of 200 under the 0.45 threshold, i.e. 1% low
                   confidence); the answer depends on the case alone, so two healthy versions agree on every case
                   (a shadowed healthy candidate agrees 100%); the mix on CASES is 35.5% approve, 33% review,
                   31.5% deny
    disagree       healthy, but the answer depends on the version too: ~30% agreement with another version (59 of
                   200 CASES), about the same mix
    fallback       HTTP 500 on every completion: the rules decide every case (fallbackReason upstream_error;
                   the rules' labels: deny above 10000, else review)
    fallback_30    HTTP 500 on the completions of 30% of the cases (by the input, so retries fail too): the rules
                   decide about 30% of decisions
    down           the upstream process is stopped: the rules decide (upstream_down), readiness turns false after
                   three failed health checks; misbehave("healthy") starts it again on the same port
    schema         ignores the output constraint: every answer is rejected (schema violations of kind "format",
                   3 per decision with the default maxRetries 2), then the rules decide (fallbackReason invalid)
    low_confidence the model is unsure at every step (confidence 1/3 < confidenceThreshold 0.45): outcome
                   low_confidence, the model's decision flagged (lowConfidencePolicy flag)
    approve_all    confidently approves every case: the decision mix shifts to 100% approve
    slow           healthy, each completion delayed by `delay_s` (misbehave("slow", delay_s=0.3))
    truncated      stops every answer at max_tokens (finish_reason length): rejected answers of kind length, the rules
                   decide (fallbackReason invalid)
    saturated      vLLM's engine full: 2 sequences at a time (max-num-seqs 2), each holding 60% of the KV cache, 0.25 s
                   each; concurrent callers wait (vllm:num_requests_waiting, queue time) and the second sequence of
                   each pair preempts (vllm:num_preemptions_total)
    long_inputs    --max-model-len 64: every prompt is longer, vLLM answers 400 "maximum context length" and the rules
                   decide (upstream error kind context_length)

Every process writes its audit records to `<workdir>/<version>/audit.jsonl` and its log to `runtime.log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter_devenv.vllm_standin import free_port

from support.paths import REPO

LABELS = ["approve", "deny", "review"]
CODES = ["income_ok", "debt_high", "thin_file"]
CASES = [{"amount": 100 + n * 37, "country": ["DE", "US", "FR", "PL"][n % 4]} for n in range(200)]
CONFIDENCE_THRESHOLD = 0.45
HEALTHY = {"mode": "valid", "keyed_by": "case", "spread": 20.0}
BEHAVIOURS: dict[str, dict[str, Any] | None] = {
    "healthy": HEALTHY,
    "disagree": {**HEALTHY, "keyed_by": "request"},
    "fallback": {**HEALTHY, "mode": "failing"},
    "fallback_30": {**HEALTHY, "fail_share": 0.3},
    "down": None,
    "schema": {**HEALTHY, "mode": "invalid"},
    "low_confidence": {**HEALTHY, "distribution": {"approve": 1 / 3, "deny": 1 / 3, "review": 1 / 3}},
    "approve_all": {**HEALTHY, "distribution": {"approve": 0.96, "deny": 0.02, "review": 0.02}},
    "slow": {**HEALTHY, "delay_s": 0.3},
    "truncated": {**HEALTHY, "mode": "truncated"},
    "saturated": {**HEALTHY, "max_num_seqs": 2, "kv_per_seq": 0.6, "delay_s": 0.25},
    "long_inputs": {**HEALTHY, "max_model_len": 64},
}


def decision_config(model: str, version: str, upstream_url: str, **overrides: Any) -> dict[str, Any]:
    cfg = {
        "model": model, "version": version, "labels": LABELS, "reasoningCodes": CODES, "steps": 2,
        "trajectoryMode": "scored", "confidenceThreshold": CONFIDENCE_THRESHOLD, "lowConfidencePolicy": "flag",
        "deadlineMs": 2000,
        "inputSchema": {"type": "object", "required": ["amount", "country"],
                        "properties": {"amount": {"type": "number", "minimum": 0},
                                       "country": {"type": "string", "minLength": 2, "maxLength": 2}}},
        "fallbackRules": [
            {"name": "large-amount", "when": "input.amount > 10000.0", "decision": "deny",
             "reasoningCode": "debt_high"},
            {"name": "default", "when": "true", "decision": "review", "reasoningCode": "thin_file"},
        ],
        "sla": {"p95LatencyMs": 150},
        "upstream": {"url": upstream_url, "servedModelName": f"{model}-{version}", "maxRetries": 2},
    }
    cfg.update(overrides)
    return cfg


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")]),
                PYTHONUNBUFFERED="1")


def _http(method: str, url: str, body: Any = None, timeout: float = 10.0, headers: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stop(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass(eq=False)  # identity: a process is a dict key (Traffic)
class RuntimeProc:
    """One version's predictor pod stand-in: the real decision server + the stand-in upstream, as processes."""

    model: str
    version: str
    namespace: str
    workdir: Path
    port: int = field(default_factory=free_port)
    upstream_port: int = field(default_factory=free_port)
    behaviour: str = "healthy"
    env: dict[str, str] = field(default_factory=dict)  # more of the decision server's environment (auth, audit)
    server: subprocess.Popen | None = None
    upstream: subprocess.Popen | None = None

    # -- addresses and labels ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def vllm_metrics_url(self) -> str:
        return f"{self.url}/metrics/vllm"

    @property
    def config_path(self) -> Path:
        return self.workdir / "decision.json"

    @property
    def shadow_path(self) -> Path:
        return self.workdir / "shadow.json"

    def labels(self) -> dict[str, str]:
        """The target labels of this version's predictor pod, as the PodMonitor's scrape attaches them."""
        from arbiter_operator.api.models import isvc_name

        isvc = isvc_name(self.model, self.version)
        return {
            "namespace": self.namespace,
            "pod": f"{isvc}-predictor-5d9f7c-{self.port}",
            "container": "kserve-container",
            "arbiter_dev_decision_model": self.model,
            "arbiter_dev_version": self.version,
            "serving_kserve_io_inferenceservice": isvc,
        }

    # -- processes -------------------------------------------------------------------------------------------------
    def _start_upstream(self) -> None:
        log = open(self.workdir / "standin.log", "ab")
        self.upstream = subprocess.Popen(
            [sys.executable, "-m", "arbiter_devenv.vllm_standin", "--host", "127.0.0.1", "--port",
             str(self.upstream_port), "--served-model-name", f"{self.model}-{self.version}", "--words",
             ",".join(LABELS + CODES)], env=_env(), stdout=log, stderr=subprocess.STDOUT)
        self._wait(f"http://127.0.0.1:{self.upstream_port}/health", self.upstream, "stand-in upstream")

    def _start_server(self) -> None:
        audit = open(self.workdir / "audit.jsonl", "ab")
        log = open(self.workdir / "runtime.log", "ab")
        # The stand-in's pid, as the container's supervisor tells the decision server vLLM's: its CPU is on /metrics.
        assert self.upstream is not None
        pid = {"ARBITER_VLLM_PID": str(self.upstream.pid)}
        self.server = subprocess.Popen(
            [sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(self.config_path), "--host",
             "127.0.0.1", "--port", str(self.port)], env={**_env(), **pid, **self.env}, stdout=audit, stderr=log)
        self._wait(f"{self.url}/v2/health/ready", self.server, "decision server")

    def _wait(self, url: str, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} of {self.version} exited with {proc.returncode}; see {self.workdir}")
            try:
                if _http("GET", url, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} of {self.version} not ready within {timeout:.0f}s; see {self.workdir}")
            time.sleep(0.1)

    def start(self, config: dict[str, Any]) -> RuntimeProc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(config, sort_keys=True))
        self._start_upstream()
        self.misbehave(self.behaviour)
        self._start_server()
        return self

    def stop(self) -> None:
        _stop(self.server)
        _stop(self.upstream)

    # -- knobs -----------------------------------------------------------------------------------------------------
    def misbehave(self, behaviour: str, **settings: Any) -> None:
        """Switch this version's upstream to one of BEHAVIOURS (settings override its stand-in settings)."""
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}; one of {sorted(BEHAVIOURS)}")
        self.behaviour = behaviour
        if BEHAVIOURS[behaviour] is None:  # down
            _stop(self.upstream)
            return
        if self.upstream is None or self.upstream.poll() is not None:
            self._start_upstream()
        status, body = _http("POST", f"http://127.0.0.1:{self.upstream_port}/standin/behaviour",
                             {**BEHAVIOURS[behaviour], **settings})
        if status != 200:
            raise RuntimeError(f"stand-in refused {behaviour}: {body[:200]!r}")

    def write_shadow(self, candidate: RuntimeProc | None = None, *, url: str | None = None,
                     candidate_version: str | None = None, sample_rate: float = 1.0, timeout_ms: int = 2000,
                     max_in_flight: int = 64, token_file: str | None = None) -> dict[str, Any]:
        """Make this version mirror to `candidate` (or to `url` as `candidate_version`); taken up within ~2 s."""
        cfg: dict[str, Any] = {"candidate": candidate_version or (candidate.version if candidate else None),
                               "url": url or (candidate.url if candidate else None), "sampleRate": sample_rate,
                               "timeoutMs": timeout_ms, "maxInFlight": max_in_flight}
        if token_file:
            cfg["tokenFile"] = token_file
        self.write_shadow_raw(json.dumps(cfg))
        return cfg

    def write_shadow_raw(self, text: str) -> None:
        tmp = self.workdir / ".shadow.json.tmp"
        tmp.write_text(text)
        tmp.replace(self.shadow_path)  # atomic, as the kubelet swaps a ConfigMap's files

    def clear_shadow(self) -> None:
        self.shadow_path.unlink(missing_ok=True)

    # -- calls -----------------------------------------------------------------------------------------------------
    def decide(self, document: Any, headers: dict | None = None) -> dict[str, Any]:
        status, body = _http("POST", f"{self.url}/v1/decisions", document, headers=headers)
        if status != 200:
            raise RuntimeError(f"{self.version}: {status} {body[:300]!r}")
        return json.loads(body)

    def call(self, document: Any, headers: dict | None = None) -> tuple[int, Any]:
        """(status, decoded body) of one /v1/decisions call, whatever the status."""
        status, body = _http("POST", f"{self.url}/v1/decisions", document, headers=headers)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def infer(self, documents: list[Any], request_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"inputs": [{"name": "input", "shape": [len(documents)], "datatype": "BYTES",
                                            "data": [json.dumps(d) for d in documents]}]}
        if request_id is not None:
            body["id"] = request_id
        status, raw = _http("POST", f"{self.url}/v2/models/{self.model}/infer", body)
        if status != 200:
            raise RuntimeError(f"{self.version}: {status} {raw[:300]!r}")
        return json.loads(raw)

    def metrics_text(self) -> str:
        return _http("GET", self.metrics_url)[1].decode()

    def records(self) -> list[dict[str, Any]]:
        path = self.workdir / "audit.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line being written
        return out


class Traffic:
    """Background callers: each process gets `rps` decisions per second (cycling through CASES) until stopped."""

    def __init__(self, rates: dict[RuntimeProc, float]):
        self._rates = dict(rates)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.answered: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self._threads: dict[int, threading.Thread] = {}
        for proc in rates:
            self._spawn(proc)

    def _spawn(self, proc: RuntimeProc) -> None:
        if id(proc) in self._threads:
            return
        t = threading.Thread(target=self._run, args=(proc,), daemon=True, name=f"traffic-{proc.version}")
        self._threads[id(proc)] = t
        t.start()

    def set(self, proc: RuntimeProc, rps: float) -> None:
        with self._lock:
            self._rates[proc] = rps
        self._spawn(proc)

    def _run(self, proc: RuntimeProc) -> None:
        n = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                rps = self._rates.get(proc, 0.0)
            if rps <= 0:
                self._stop.wait(0.1)
                next_at = time.monotonic()
                continue
            try:
                proc.decide(CASES[n % len(CASES)])
                self.answered[proc.version] = self.answered.get(proc.version, 0) + 1
            except (OSError, RuntimeError):
                self.failed[proc.version] = self.failed.get(proc.version, 0) + 1
            n += 1
            next_at += 1.0 / rps
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads.values():
            t.join(15)


class RuntimeFleet:
    """Starts and stops RuntimeProcs (one per version) under `workdir`; see the module docstring."""

    def __init__(self, workdir: str | Path, namespace: str = "arbiter-e2e", model: str = "credit"):
        self.workdir = Path(workdir)
        self.namespace = namespace
        self.model = model
        self.procs: dict[str, RuntimeProc] = {}
        self._traffic: list[Traffic] = []

    def start_version(self, version: str, behaviour: str = "healthy", env: dict[str, str] | None = None,
                      **decision_overrides: Any) -> RuntimeProc:
        """env: more of the decision server's environment (e.g. ARBITER_AUTH_*, ARBITER_AUDIT_S3_*)."""
        proc = RuntimeProc(self.model, version, self.namespace, self.workdir / version, behaviour=behaviour,
                           env=dict(env or {}))
        self.procs[version] = proc
        try:
            proc.start(decision_config(self.model, version, f"http://127.0.0.1:{proc.upstream_port}/v1",
                                       **decision_overrides))
        except Exception:
            proc.stop()
            raise
        return proc

    def traffic(self, rates: dict[RuntimeProc, float]) -> Traffic:
        t = Traffic(rates)
        self._traffic.append(t)
        return t

    def stop(self) -> None:
        for t in self._traffic:
            t.stop()
        for proc in self.procs.values():
            proc.stop()

    def __enter__(self) -> RuntimeFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
