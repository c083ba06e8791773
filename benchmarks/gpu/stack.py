"""Start and stop the serving stack on a GPU machine: `vllm serve` with the operator's arguments, and the
decision server (arbiter_runtime) in front of it, as the runtime's `serve` command runs it against an upstream URL.

Each process gets its own session (setsid), so it outlives the command that started it when a later command
(gpu_bench.py after gpu_check.py, or the second device run) needs it; its pid is kept under STATE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STATE = Path(os.environ.get("ARBITER_GPU_STATE", "/tmp/arbiter-gpu"))
MODEL_DIR = os.environ.get("ARBITER_GPU_MODEL_DIR", "/mnt/models")  # the rendered args serve /mnt/models
# The same weights with the tokenizer that has every (code, label) pair as one token (scoredFormat fused).
FUSED_MODEL_DIR = MODEL_DIR.rstrip("/") + "-fused"
# Plumbing dry run without a GPU: the runtime's stand-in upstream (same wire format) takes vLLM's place.
STANDIN = os.environ.get("ARBITER_GPU_STANDIN") == "1"
VLLM_URL = "http://127.0.0.1:8000"  # --port=8000 in the rendered args; decision.json's upstream.url points here
SCORED_PORT = 8080
GENERATED_PORT = 8081

for p in (HERE, ROOT / "operator", ROOT / "runtime"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# NVLink multicast (NCCL NVLS, torch symmetric memory, NVSHMEM) stays off: GPU hosts partitioned between
# tenants may not allow it, and the figures do not depend on it (benchmarks/gpu/README.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def fixture(name: str):
    return json.loads((HERE / "fixture" / name).read_text())


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    paths = [str(ROOT / d) for d in ("operator", "runtime", "devenv")]
    paths += [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start(name: str, cmd: list[str], env_extra: dict[str, str] | None = None) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / f"{name}.log", "ab")
    log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(env_extra), cwd=str(ROOT),
                            start_new_session=True)
    (STATE / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def pid(name: str) -> int | None:
    try:
        p = int((STATE / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        # A child of this process that exited is a zombie until reaped, and signal 0 still reaches it.
        if os.waitpid(p, os.WNOHANG)[0] == p:
            return None
    except ChildProcessError:
        pass
    try:
        os.kill(p, 0)
    except OSError:
        return None
    return p


def kill(name: str, sig: int = signal.SIGKILL, wait: float = 30.0) -> bool:
    """Signal the whole process group (vLLM's engine and workers are children of the API server)."""
    p = pid(name)
    if p is None:
        return False
    try:
        os.killpg(p, sig)
    except ProcessLookupError:
        return False
    end = time.time() + wait
    while time.time() < end and pid(name) is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, os.WNOHANG)
        time.sleep(0.1)
    return True


def stop_group(name: str, grace: float = 30.0) -> None:
    """SIGTERM to the process group, then SIGKILL to whatever of it is left, and wait until none of it is: the GPU
    memory of a vLLM (its engine runs in child processes) is free only once every one of them has exited, and the
    next vLLM on this GPU checks the free memory when it starts."""
    try:
        p = int((STATE / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return
    kill(name, signal.SIGTERM, wait=grace)
    end = time.time() + 30
    while time.time() < end:
        try:
            os.killpg(p, signal.SIGKILL)
        except ProcessLookupError:
            return  # the group is empty
        except PermissionError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, os.WNOHANG)
        time.sleep(0.2)


def tail(name: str, lines: int = 40) -> str:
    try:
        return "\n".join((STATE / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def vllm_args(tp: int) -> list[str]:
    """The operator's rendered arguments (fixture/vllm-args-tpN.json, re-checked against the operator's code by
    render_fixture.py --check)."""
    return list(fixture(f"vllm-args-tp{tp}.json"))


# `vllm serve ARGS` as a command line: vLLM's CLI, or in a plumbing run the stand-in that takes the same arguments.
STANDIN_VLLM = [sys.executable, str(HERE / "standin_vllm.py")]
VLLM_SERVE = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def serve_command(args: list[str]) -> list[str]:
    return (STANDIN_VLLM if STANDIN else VLLM_SERVE) + list(args)


def supervisor_env() -> dict[str, str]:
    """The environment of `arbiter_runtime supervise`: in a plumbing run it starts the stand-in in vLLM's place."""
    return {"ARBITER_VLLM_COMMAND": shlex.join(STANDIN_VLLM)} if STANDIN else {}


def with_args(args: list[str], model_dir: str | None = None, **flags: object) -> list[str]:
    """The rendered arguments with the model directory and some `--flag=value`s replaced (or added): e.g.
    with_args(args, port=8100, gpu_memory_utilization=0.12) for a second server on the same GPU."""
    out = list(args)
    if model_dir is not None:
        out[0] = model_dir
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        out = [a for a in out if a != flag and not a.startswith(flag + "=")] + [f"{flag}={value}"]
    return out


def start_vllm(tp: int, args: list[str] | None = None) -> int:
    args = vllm_args(tp) if args is None else args
    devices = ",".join(str(i) for i in range(tp))
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]
    if STANDIN:
        import underwriting as uw

        cmd = [sys.executable, "-m", "arbiter_devenv.vllm_standin", "--port", "8000",
               "--served-model-name", uw.MODEL_NAME, "--words", ",".join((*uw.LABELS, *uw.CODES)),
               "--model-dir", MODEL_DIR]
    return start("vllm", cmd, {"CUDA_VISIBLE_DEVICES": devices})


async def wait_ready(url: str, timeout: float, process: str | None = None) -> float:
    """Poll url until it answers 200; returns seconds waited. Fails fast if `process` died."""
    from loadgen import get

    t0 = time.time()
    while time.time() - t0 < timeout:
        status, _ = await get(url, timeout=2.0)
        if status == 200:
            return time.time() - t0
        if process and pid(process) is None:
            raise RuntimeError(f"{process} exited while starting:\n{tail(process)}")
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s\n{tail(process) if process else ''}")


def write_config(mode: str) -> Path:
    """decision.json as the operator renders it (fixture/decision-MODE.json)."""
    STATE.mkdir(parents=True, exist_ok=True)
    path = STATE / f"decision-{mode}.json"
    path.write_text(json.dumps(fixture(f"decision-{mode}.json")))
    return path


def start_runtime(mode: str) -> int:
    port = SCORED_PORT if mode == "scored" else GENERATED_PORT
    cmd = [sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(write_config(mode)),
           "--host", "127.0.0.1", "--port", str(port), "--model-dir", MODEL_DIR]
    return start(f"runtime-{mode}", cmd)


def runtime_url(mode: str) -> str:
    return f"http://127.0.0.1:{SCORED_PORT if mode == 'scored' else GENERATED_PORT}"


def stop_all() -> None:
    for name in ("runtime-scored", "runtime-generated", "vllm"):
        kill(name, signal.SIGTERM, wait=10)
        kill(name, signal.SIGKILL, wait=5)
