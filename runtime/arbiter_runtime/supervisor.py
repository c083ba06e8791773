"""One container, two processes: `vllm serve` and the decision server.

The supervisor starts both, forwards SIGTERM/SIGINT to both, and exits as soon as either one exits (killing the
other), so the kubelet restarts the container instead of leaving a half-working pod. Readiness is the decision
server's /v2/health/ready, which turns true only after the upstream's /health answers and the label tokens are
resolved: ready only when both are.

    python -m arbiter_runtime supervise [--config decision.json] [--port 8000] -- <vllm serve arguments>
    python -m arbiter_runtime supervise --upstream http://host:port/v1      # no vLLM child: any OpenAI server

Several vLLM engines (`--engines N`, $ARBITER_VLLM_ENGINES; spec.serving.vllm.engines) share the pod's GPU when one
engine's scheduler process, a core of CPU, is the bound of its decisions/s: engine i serves on vLLM's port + i, and
starts once engine i-1 answers /health (`arbiter-runtime after`), because vLLM sizes its KV cache from the GPU memory
it sees while it profiles, and an engine loading beside it would be counted as its own. The operator renders each
engine's share of gpuMemoryUtilization into the arguments. The decision server sends each request to the engine
with the fewest in flight (upstream.EnginePicker).

The vLLM arguments come after `--` or from $ARBITER_VLLM_ARGS (a JSON list, or a shell-quoted string), as the
operator renders them; the command is `python3 -m vllm.entrypoints.cli.main serve` unless $ARBITER_VLLM_COMMAND
(shell-quoted) replaces it. The first argument that is a directory with tokenizer.json is the model directory the
decision server reads label tokens from.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

from . import vllm_processes

log = logging.getLogger("arbiter.supervisor")

DEFAULT_VLLM_COMMAND = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
# vLLM's environment where the container does not set it. VLLM_REGEX_COMPILATION_TIMEOUT_S=0: vLLM guards each
# request's regex with a thread pool made for the request (in the API server, which parses the regex to validate
# it, and again in the engine core, which compiles it), so that a caller's pathological pattern times out. vLLM's
# only caller here is the decision server, on 127.0.0.1, and its regex is a fixed concatenation of escaped label and
# code alternatives, linear to compile. The two threads cost about 0.25 ms of the API server's CPU and 0.2 ms of
# the engine core's per decision, the processes that bound a pod's decisions/s (on a development machine's CPU:
# benchmarks/gpu/grammar_setup.py).
VLLM_ENV_DEFAULTS = {"VLLM_REGEX_COMPILATION_TIMEOUT_S": "0"}
# vLLM's API server writes a uvicorn access-log line per request: from 127.0.0.1 (the decision server, its /health
# checks every 2 s, the /metrics/vllm scrapes), so it says nothing the decision server's metrics do not, costs
# 45-75 us of the API server's CPU per request (a bare uvicorn on httptools, 72 bytes a line: benchmarks/
# access_log.py) and, at 400 decisions/s, 2.5 GB of logs a day per pod. Off unless the arguments say either way
# (`--no-disable-uvicorn-access-log` in spec.serving.vllm.extraArgs keeps it).
ACCESS_LOG_FLAG = "--disable-uvicorn-access-log"
# From SIGTERM, how long the shutdown may take: the supervisor's SIGKILL bound, and the decision server's deadline
# for its audit (service.Runtime.stop). Below Kubernetes' default terminationGracePeriodSeconds (30 s).
DEFAULT_SHUTDOWN_GRACE_S = 25.0
ENGINES_ENV = "ARBITER_VLLM_ENGINES"
MAX_ENGINES = 8  # the CRD's maximum of spec.serving.vllm.engines
AFTER_POLL_S = 0.5


def shutdown_grace_s(env: dict[str, str]) -> float:
    raw = env.get("ARBITER_SHUTDOWN_GRACE_S", "")
    try:
        grace = float(raw) if raw else DEFAULT_SHUTDOWN_GRACE_S
    except ValueError:
        grace = -1.0
    if not 0 < grace < float("inf"):
        raise ValueError(f"ARBITER_SHUTDOWN_GRACE_S must be a number of seconds above 0, not {raw!r}")
    return grace


def vllm_args_from_env(env: dict[str, str]) -> list[str]:
    raw = env.get("ARBITER_VLLM_ARGS", "").strip()
    if not raw:
        return []
    if raw.startswith("["):
        value = json.loads(raw)
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ValueError("ARBITER_VLLM_ARGS must be a JSON list of strings or a shell-quoted string")
        return value
    return shlex.split(raw)


def find_model_dir(args: list[str]) -> str | None:
    for arg in args:
        if not arg.startswith("-") and (Path(arg) / "tokenizer.json").is_file():
            return arg
    return None


def upstream_url_from_args(args: list[str]) -> str:
    """vllm serve's --host/--port as the decision server must reach them."""
    host, port = "127.0.0.1", "8000"
    for i, arg in enumerate(args):
        for flag in ("--port", "--host"):
            value = None
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value is not None:
                if flag == "--port":
                    port = value
                elif value not in ("0.0.0.0", "::", ""):
                    host = value
    return f"http://{host}:{port}/v1"


def _flag(arg: str) -> str:
    """A `vllm serve` flag as vLLM reads it: without its `=value`, underscores as dashes."""
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else arg


def vllm_env(env: dict[str, str]) -> dict[str, str]:
    """vLLM's environment: the container's, with VLLM_ENV_DEFAULTS where it sets none of them."""
    return {**VLLM_ENV_DEFAULTS, **env}


def engine_args(args: list[str], engine: int) -> list[str]:
    """Engine `engine`'s arguments: vLLM's port plus the engine's number (0: the arguments as they are)."""
    if engine == 0:
        return list(args)
    port = int(upstream_url_from_args(args).rsplit(":", 1)[1].split("/", 1)[0])
    kept = [a for i, a in enumerate(args)
            if not (a == "--port" or a.startswith("--port=") or (i > 0 and args[i - 1] == "--port"))]
    return [*kept, f"--port={port + engine}"]


def engine_name(engine: int) -> str:
    return "vllm" if engine == 0 else f"vllm-{engine}"


def engines_from(value: str) -> int:
    try:
        engines = int(value or "1")
    except ValueError:
        engines = 0
    if not 1 <= engines <= MAX_ENGINES:
        raise ValueError(f"ARBITER_VLLM_ENGINES must be a whole number from 1 to {MAX_ENGINES}, not {value!r}")
    return engines


def build_commands(opts: argparse.Namespace, vllm_args: list[str],
                   env: dict[str, str]) -> list[tuple[str, list[str]]]:
    children: list[tuple[str, list[str]]] = []
    upstreams = [opts.upstream] if opts.upstream else []
    model_dir = opts.model_dir
    if not upstreams:
        command = shlex.split(env["ARBITER_VLLM_COMMAND"]) if env.get("ARBITER_VLLM_COMMAND") else \
            list(DEFAULT_VLLM_COMMAND)
        vllm_args = list(vllm_args)
        # vLLM stays private to the pod (only the decision server is exposed) and off the server's port.
        given = {_flag(a) for a in vllm_args}
        if "--host" not in given:
            vllm_args += ["--host", "127.0.0.1"]
        if "--port" not in given:
            vllm_args += ["--port", "8000"]
        if not given & {ACCESS_LOG_FLAG, "--no-" + ACCESS_LOG_FLAG[2:]}:
            vllm_args.append(ACCESS_LOG_FLAG)
        for engine in range(opts.engines):
            args = engine_args(vllm_args, engine)
            upstreams.append(upstream_url_from_args(args))
            gate = [] if engine == 0 else [sys.executable, "-m", "arbiter_runtime", "after",
                                           upstreams[-2].removesuffix("/v1") + "/health", "--"]
            children.append((engine_name(engine), gate + command + args))
        model_dir = model_dir or find_model_dir(vllm_args)
    server = [sys.executable, "-m", "arbiter_runtime", "serve", "--port", str(opts.port), "--host", opts.host]
    for upstream in upstreams:
        server += ["--upstream", upstream]
    if opts.config:
        server += ["--config", opts.config]
    if model_dir:
        server += ["--model-dir", model_dir]
    children.append(("decision-server", server))
    return children


def after(argv: list[str]) -> int:
    """`arbiter-runtime after URL -- COMMAND...`: wait until URL answers 200, then become COMMAND (the same pid, so
    the supervisor's signals and the decision server's CPU readings reach it). The supervisor starts an engine this
    way once the engine before it is up; if that one exits instead, the supervisor stops the container."""
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        print("usage: arbiter-runtime after URL -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    url, command = argv[0], argv[2:]
    # No proxy from the environment between the supervisor's children on 127.0.0.1.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        try:
            with opener.open(url, timeout=2) as resp:
                if resp.status == 200:
                    break
        except (OSError, ValueError, http.client.HTTPException):  # not up yet, or answering something not HTTP
            pass
        time.sleep(AFTER_POLL_S)
    log.info("%s answers: starting %s", url, shlex.join(command[:4]))
    os.execvp(command[0], command)
    return 127  # not reached


def ray_head_address(env: dict[str, str]) -> str | None:
    """Where a multi-node worker finds the head's Ray: $RAY_ADDRESS, or KServe's $HEAD_SVC in $POD_NAMESPACE."""
    if env.get("RAY_ADDRESS"):
        return env["RAY_ADDRESS"]
    if env.get("HEAD_SVC"):
        ns = env.get("POD_NAMESPACE")
        host = f"{env['HEAD_SVC']}.{ns}.svc.cluster.local" if ns else env["HEAD_SVC"]
        return f"{host}:{env.get('RAY_PORT', '6379')}"
    return None


def worker(argv: list[str]) -> int:
    """`arbiter-runtime worker`: a multi-node worker pod joins the head's Ray cluster and stays there."""
    address = ray_head_address(dict(os.environ))
    if not address:
        print("arbiter-runtime worker: set RAY_ADDRESS (host:port of the head's Ray) or HEAD_SVC/POD_NAMESPACE",
              file=sys.stderr)
        return 2
    os.execvp("ray", ["ray", "start", "--block", f"--address={address}", *argv])
    return 127  # not reached


def uses_ray(args: list[str]) -> bool:
    return any(a in ("--distributed-executor-backend=ray",) for a in args) or any(
        a == "--distributed-executor-backend" and i + 1 < len(args) and args[i + 1] == "ray"
        for i, a in enumerate(args))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    vllm_cli: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, vllm_cli = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="arbiter-runtime supervise",
                                description="Run vllm serve and the decision server in one container")
    p.add_argument("--config", default=os.environ.get("ARBITER_DECISION_CONFIG"))
    p.add_argument("--host", default=os.environ.get("ARBITER_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(os.environ.get("ARBITER_PORT", "8080")))
    p.add_argument("--model-dir", default=os.environ.get("ARBITER_MODEL_DIR") or None)
    p.add_argument("--upstream", default=os.environ.get("ARBITER_UPSTREAM_URL") or None,
                   help="use this OpenAI-compatible server instead of starting vllm serve")
    p.add_argument("--engines", default=os.environ.get(ENGINES_ENV, "1"),
                   help="vLLM engines sharing the GPU, each on vLLM's port + its number (default: "
                        f"${ENGINES_ENV}, else 1)")
    p.add_argument("--grace-s", type=float, default=None,
                   help="how long children get to exit after SIGTERM before SIGKILL (default: "
                        "$ARBITER_SHUTDOWN_GRACE_S, else 25)")
    opts = p.parse_args(argv)
    env = dict(os.environ)
    try:
        grace = shutdown_grace_s({"ARBITER_SHUTDOWN_GRACE_S": str(opts.grace_s)} if opts.grace_s is not None
                                 else env)
        vllm_args = vllm_cli or vllm_args_from_env(env)
        opts.engines = engines_from(opts.engines)
    except ValueError as exc:
        print(f"arbiter-runtime supervise: {exc}", file=sys.stderr)
        return 2
    if not opts.upstream and not vllm_args:
        print("arbiter-runtime supervise: no vllm serve arguments (after --, or $ARBITER_VLLM_ARGS) and no "
              "--upstream: nothing to serve", file=sys.stderr)
        return 2
    if not opts.upstream and uses_ray(vllm_args) and not env.get("ARBITER_VLLM_COMMAND"):
        # Multi-node: the head starts Ray first so that the worker pods (`arbiter-runtime worker`) can join it.
        rc = subprocess.call(["ray", "start", "--head", f"--port={env.get('RAY_PORT', '6379')}"])
        if rc != 0:
            log.error("ray start --head failed with code %s", rc)
            return rc
    children = build_commands(opts, vllm_args, env)
    return Supervisor(children, grace).run()


class Supervisor:
    def __init__(self, children: list[tuple[str, list[str]]], grace_s: float):
        self.children = children
        self.grace_s = grace_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping: int | None = None
        self._stop_at: float | None = None  # time.monotonic() of the first stop: the grace period counts from it

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stopping is None:
            self.stopping = signum
            self._stop_at = time.monotonic()
            log.info("received %s: stopping children", signal.Signals(signum).name)
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        # The children get the same grace: the decision server times its audit flush to end before the SIGKILL.
        env = dict(os.environ, ARBITER_SHUTDOWN_GRACE_S=str(self.grace_s))
        engines: list[str] = []
        for name, cmd in self.children:
            log.info("starting %s: %s", name, shlex.join(cmd))
            is_vllm = name == "vllm" or name.startswith("vllm-")
            self.procs[name] = subprocess.Popen(cmd, env=vllm_env(env) if is_vllm else env)
            if is_vllm:  # started first: the decision server reports the CPU of vLLM's processes
                engines.append(str(self.procs[name].pid))
                env = dict(env, **{vllm_processes.PID_ENV: ",".join(engines)})
        code = 0
        while True:
            if os.getpid() == 1:
                self._reap_orphans()
            exited = [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]
            if exited:
                name, rc = exited[0]
                if self.stopping is None:
                    log.error("%s exited with code %s: stopping the container", name, rc)
                    code = rc if rc else 1
                self._stop_all()
                break
            if self.stopping is not None and all(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(0.1)
        if self.stopping is not None and code == 0:
            # Stop on request: exit 0 when every child stopped cleanly, else with the code of one that did not (the
            # decision server's 4: audit records were lost, its log says how many per sink).
            unclean = {n: p.returncode for n, p in self.procs.items()
                       if p.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)}
            for name, rc in unclean.items():
                log.error("%s exited with code %s while stopping", name, rc)
            code = max((abs(rc or 1) for rc in unclean.values()), default=0)
        return code

    def _reap_orphans(self) -> None:
        """As PID 1 (no init in the image) collect exited orphans, e.g. vLLM's worker processes, so no zombies
        pile up; an exit of one of our own children is handed to its Popen."""
        ours = {p.pid: p for p in self.procs.values()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in ours and ours[pid].returncode is None:
                ours[pid].returncode = os.waitstatus_to_exitcode(status)

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self._stop_at = self._stop_at or time.monotonic()
        deadline = self._stop_at + self.grace_s
        for proc in self.procs.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.wait(remaining)
            except subprocess.TimeoutExpired:
                log.error("pid %s did not stop within %.0f s: killing it", proc.pid, self.grace_s)
                proc.kill()
                proc.wait()
