"""The supervisor as the container runs it: two real child processes (the stand-in plays `vllm serve`)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from arbiter_devenv.vllm_standin import free_port
from arbiter_operator.cli.promclient import Prometheus
from arbiter_operator.cli.queries import version_metrics
from arbiter_runtime.supervisor import (
    build_commands,
    engines_from,
    find_model_dir,
    ray_head_address,
    upstream_url_from_args,
    uses_ray,
    vllm_args_from_env,
    vllm_env,
)
from prometheus_client.parser import text_string_to_metric_families
from support.promstack import module_stack
from support.runtime_helpers import LABELS, base_config

stack = module_stack()


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture
def supervised(tmp_path):
    yield from _supervised(tmp_path, engines=1)


@pytest.fixture
def supervised_engines(tmp_path):
    """Two engines, as the operator renders spec.serving.vllm.engines: 2 (ARBITER_VLLM_ENGINES)."""
    yield from _supervised(tmp_path, engines=2)


def _supervised(tmp_path, engines: int):
    upstream_port, port = free_port(), free_port()
    while engines > 1 and not _free(upstream_port + 1):
        upstream_port = free_port()
    cfg = tmp_path / "decision.json"
    cfg.write_text(json.dumps(base_config(f"http://127.0.0.1:{upstream_port}/v1")))
    model_dir = tmp_path / "model"
    # The container's form: `arbiter-runtime <vllm serve args>` with the server's settings in the environment, as
    # the operator renders them; the stand-in plays `vllm serve`.
    env = dict(os.environ, ARBITER_VLLM_COMMAND=f"{sys.executable} -m arbiter_devenv.vllm_standin",
               ARBITER_DECISION_CONFIG=str(cfg), ARBITER_PORT=str(port), ARBITER_AUTH="false", PYTHONUNBUFFERED="1",
               ARBITER_SHUTDOWN_GRACE_S="6", **({"ARBITER_VLLM_ENGINES": str(engines)} if engines > 1 else {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "arbiter_runtime", f"--port={upstream_port}", "--served-model-name", "credit-v1",
         "--words", ",".join(LABELS), "--model-dir", str(model_dir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "supervised server never became ready"
        time.sleep(0.2)
    try:
        yield (proc, url) if engines == 1 else (proc, url, [upstream_port + i for i in range(engines)])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in _children(proc.pid):
            os.kill(child, signal.SIGKILL)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_sigterm_stops_both_and_the_audit_is_on_stdout(supervised):
    proc, url = supervised
    r = httpx.post(url + "/v1/decisions", json={"amount": 10, "country": "DE"}, timeout=10)
    assert r.status_code == 200 and r.json()["source"] == "model"
    children = _children(proc.pid)
    assert len(children) == 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not any(Path(f"/proc/{c}").exists() and "zombie" not in (Path(f"/proc/{c}/status").read_text())
                   for c in children)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(records) == 1 and records[0]["traceId"] == r.json()["traceId"]


def _vllm_cpu(url: str) -> dict[tuple[str, str], float]:
    page = httpx.get(url + "/metrics", timeout=10).text
    return {(x.labels["process"], x.labels["index"]): x.value for family in text_string_to_metric_families(page)
            if family.name == "arbiter_vllm_process_cpu_seconds" for x in family.samples}


def test_the_metrics_page_reports_the_cpu_of_the_vllm_it_started(supervised):
    """vLLM's one API server is the process the supervisor started: its CPU is on the decision server's page and
    grows with the decisions it answers (the alert ArbiterVLLMAPIServerSaturated reads its rate)."""
    _proc, url = supervised
    before = _vllm_cpu(url)
    assert list(before) == [("api-server", "0")]
    with httpx.Client(base_url=url, timeout=10) as c:
        for n in range(200):
            c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
    after = _vllm_cpu(url)
    assert after[("api-server", "0")] > before[("api-server", "0")]


def test_prometheus_reads_the_busiest_vllm_process_as_diagnose_asks(supervised, stack):
    """The real Prometheus scrapes the supervised decision server as the PodMonitor does; diagnose's query of the
    busiest vLLM process (queries.version_metrics) reads the API server's cores from it while callers decide."""
    _proc, url = supervised
    port = int(url.rsplit(":", 1)[1])
    namespace = f"vllm-cpu-{port}"
    target = SimpleNamespace(port=port, model="credit", version="v1", labels=lambda: {
        "namespace": namespace, "pod": f"credit--v1-predictor-{port}", "container": "kserve-container",
        "arbiter_dev_decision_model": "credit", "arbiter_dev_version": "v1"})
    stack.add_runtime(target)
    prom = Prometheus(stack.url, None, 10.0)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=url, timeout=10) as c:
            while True:
                for n in range(50):
                    c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
                seen = version_metrics(prom, namespace, "credit", "v1", 10).busiest_cores
                if seen.get("api-server", 0.0) > 0.0:
                    break
                assert time.monotonic() < deadline, f"Prometheus never reported vLLM's API server: {seen}"
        assert set(seen) == {"api-server"} and seen["api-server"] < 2.0, seen  # the stand-in is one process
    finally:
        prom.close()
        stack.remove_runtime(target)


def test_a_lost_audit_record_is_the_containers_exit_code(supervised):
    """Nobody reads the container's stdout: the decision server gives up on it at the deadline and exits 4; the
    container exits 4 too, after SIGTERM, with the count in the log."""
    proc, url = supervised  # its stdout is a pipe this test reads only once the container is gone
    with httpx.Client(base_url=url, timeout=10) as c:
        for n in range(300):
            c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)  # still not reading
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 4, err
    assert "decision-server exited with code 4 while stopping" in err
    found = re.search(r"audit records not written at shutdown: stdout (\d+) \(of 300 recorded\)", err)
    assert found and int(found[1]) == 300 - out.count("\n") > 0


def _environ(pid: int) -> dict[str, str]:
    raw = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


def test_supervisor_exits_when_vllm_dies(supervised):
    proc, _url = supervised
    (upstream,) = [c for c in _children(proc.pid) if "vllm_standin" in _cmdline(c)]
    # vLLM runs without its per-request regex timeout threads; the decision server is told vLLM's pid.
    assert _environ(upstream)["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == "0"
    assert "--disable-uvicorn-access-log" in _cmdline(upstream).split()
    (server,) = [c for c in _children(proc.pid) if c != upstream]
    assert _environ(server)["ARBITER_VLLM_PID"] == str(upstream)
    os.kill(upstream, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert "vllm exited" in proc.stderr.read()


def test_supervisor_argument_handling(tmp_path):
    assert vllm_args_from_env({"ARBITER_VLLM_ARGS": '["/models/m", "--max-model-len", "4096"]'})[2] == "4096"
    assert vllm_args_from_env({"ARBITER_VLLM_ARGS": "/models/m --served-model-name 'a b'"})[-1] == "a b"
    assert upstream_url_from_args(["m", "--port", "9001", "--host", "0.0.0.0"]) == "http://127.0.0.1:9001/v1"
    assert upstream_url_from_args(["m", "--port=7000"]) == "http://127.0.0.1:7000/v1"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    assert find_model_dir(["--dtype", "bfloat16", str(tmp_path / "m")]) == str(tmp_path / "m")
    assert ray_head_address({"HEAD_SVC": "m-head", "POD_NAMESPACE": "ns"}) == "m-head.ns.svc.cluster.local:6379"
    assert uses_ray(["m", "--distributed-executor-backend=ray"]) and not uses_ray(["m"])
    # vLLM's access log is off unless the arguments say either way, in any spelling vLLM reads.
    opts = argparse.Namespace(upstream=None, model_dir=None, port=8080, host="0.0.0.0", config=None, engines=1)

    def served(*args: str) -> list[str]:
        return dict(build_commands(opts, ["m", *args], {}))["vllm"]

    assert served().count("--disable-uvicorn-access-log") == 1
    # A host or port the arguments give, in any spelling vLLM reads, is not given again.
    assert "8000" not in served("--port=9000") and "127.0.0.1" not in served("--host", "0.0.0.0")
    assert "--disable-uvicorn-access-log" not in served("--no-disable-uvicorn-access-log")
    assert "--disable-uvicorn-access-log" not in served("--disable_uvicorn_access_log")
    # The container's own setting wins over the supervisor's default for vLLM.
    assert vllm_env({})["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == "0"
    assert vllm_env({"VLLM_REGEX_COMPILATION_TIMEOUT_S": "5"})["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == "5"


def test_two_engines_one_after_the_other_both_deciding(supervised_engines):
    """engines 2: the second engine is started on vLLM's port + 1 once the first answers; the decision server knows
    both (their pids for the CPU series, their URLs for the requests) and every engine decides a share."""
    proc, url, ports = supervised_engines
    children = _children(proc.pid)
    engines = [c for c in children if "vllm_standin" in _cmdline(c)]
    assert sorted(int(re.search(r"--port[= ](\d+)", _cmdline(c))[1]) for c in engines) == ports
    (server,) = [c for c in children if c not in engines]
    assert sorted(_environ(server)["ARBITER_VLLM_PID"].split(",")) == sorted(str(c) for c in engines)
    with httpx.Client(base_url=url, timeout=10) as c:
        for n in range(60):
            c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
        page = c.get("/metrics/vllm").text
        cpu = {(x.labels["engine"], x.labels["process"]) for family in text_string_to_metric_families(
            c.get("/metrics").text) if family.name == "arbiter_vllm_process_cpu_seconds" for x in family.samples}
    served = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                served[sample.labels["engine"]] = served.get(sample.labels["engine"], 0) + sample.value
    # One at a time, the engines take the requests in turn.
    assert served == {"0": 30, "1": 30}
    assert cpu == {("0", "api-server"), ("1", "api-server")}


def test_the_container_stops_when_either_engine_dies(supervised_engines):
    proc, _url, ports = supervised_engines
    (second,) = [c for c in _children(proc.pid) if f"--port={ports[1]}" in _cmdline(c)]
    os.kill(second, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert "vllm-1 exited" in proc.stderr.read()


def test_engine_commands():
    """Each engine's arguments differ only in vLLM's port; the second waits for the first's /health."""
    opts = argparse.Namespace(upstream=None, model_dir=None, port=8080, host="0.0.0.0", config=None, engines=3)
    commands = dict(build_commands(opts, ["m", "--port", "9000", "--max-num-seqs=64"], {}))
    assert list(commands) == ["vllm", "vllm-1", "vllm-2", "decision-server"]
    assert "after" not in commands["vllm"] and commands["vllm"][4:8] == ["m", "--port", "9000", "--max-num-seqs=64"]
    for engine in (1, 2):
        cmd = commands[f"vllm-{engine}"]
        gate = cmd.index("after")
        assert cmd[gate + 1] == f"http://127.0.0.1:{9000 + engine - 1}/health" and cmd[gate + 2] == "--"
        assert f"--port={9000 + engine}" in cmd and "9000" not in cmd and "--max-num-seqs=64" in cmd
    server = commands["decision-server"]
    assert [server[i + 1] for i, a in enumerate(server) if a == "--upstream"] == [
        f"http://127.0.0.1:{9000 + i}/v1" for i in range(3)]
    for bad in ("0", "9", "two", "-1"):
        with pytest.raises(ValueError, match="ARBITER_VLLM_ENGINES must be a whole number from 1 to 8"):
            engines_from(bad)
