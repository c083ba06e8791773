"""The development Model Registry (PostgreSQL + registry server): runs as root too, and never outlives its owner."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from arbiter_devenv._procs import pid_alive, wait_gone
from arbiter_devenv.registryserver import STOP_BOUND_S

CHILD = r"""
import json, time
from arbiter_devenv.registryserver import start_model_registry
with start_model_registry() as mr:
    print(json.dumps({"pids": [mr.proc.pid, mr.postgres.proc.pid], "dir": str(mr.workdir), "url": mr.url}), flush=True)
    time.sleep(600)
"""


# The owner's stop: registryserver._stop for the registry, then for PostgreSQL.
STOP_BOUND = 2 * STOP_BOUND_S


def log_tails(workdir: str) -> str:
    out = []
    for log in ("model-registry.log", "pg/postgres.log"):
        try:
            with open(os.path.join(workdir, log), errors="replace") as f:
                out.append(f"--- {log}\n" + "".join(f.readlines()[-20:]))
        except OSError as exc:
            out.append(f"--- {log}: {exc}")
    return "\n".join(out)


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_registry_and_database_die_with_their_owner(sig):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    started: dict = {}
    try:
        line = child.stdout.readline()
        assert line, f"child exited early with {child.wait()}"
        started = json.loads(line)
        registry_pid, postgres_pid = started["pids"]
        assert pid_alive(registry_pid) and pid_alive(postgres_pid)
        if os.geteuid() == 0:
            assert uid_of(postgres_pid) != 0  # PostgreSQL refuses root; it runs as the postgres user

        child.send_signal(sig)
        try:
            # The owner's stop is bounded (STOP_BOUND, 60 s); a loaded machine may take longer to run it.
            child.wait(timeout=STOP_BOUND + 30)
        except subprocess.TimeoutExpired:
            alive = [p for p in (registry_pid, postgres_pid) if pid_alive(p)]
            raise AssertionError(f"the owner was still running {STOP_BOUND + 30} s after {sig.name}; servers alive: "
                                 f"{alive}\n{log_tails(started['dir'])}") from None
        assert wait_gone([registry_pid, postgres_pid], timeout=30) == []
        if sig != signal.SIGKILL:
            assert not os.path.exists(started["dir"])  # database files removed on an orderly exit
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if started.get("dir"):
            shutil.rmtree(started["dir"], ignore_errors=True)  # after SIGKILL nobody else can
