"""Servers started by the development environment die with the Python process that started them, however it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from arbiter_devenv._procs import pid_alive, stop_bound, wait_gone
from support.polling import eventually

# Starts a control plane and the S3 server, reports their pids and work dirs, then idles until it is signalled.
CHILD = r"""
import json, signal, sys, time
# A process started in the background of a non-interactive shell inherits SIGINT ignored: give the owner Python's
# own SIGINT handling, as it has when started from a terminal, whatever runs the suite.
signal.signal(signal.SIGINT, signal.default_int_handler)
from arbiter_devenv.controlplane import ControlPlane
from arbiter_devenv.s3server import S3Server
cp = ControlPlane().start()
s3 = S3Server().start()
print(json.dumps({"pids": [*cp.pids.values(), s3.pid], "dirs": [str(cp.workdir), str(s3.workdir)]}), flush=True)
time.sleep(600)
"""
# The owner's stop is bounded: kube-apiserver, etcd and the S3 server, one after another, each by _procs.terminate
# (45 s at worst).
STOP_BOUND = 3 * stop_bound()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_servers_do_not_outlive_their_owner(sig):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line, f"child exited early with {child.wait()}"
        started = json.loads(line)
        pids = started["pids"]
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)

        child.send_signal(sig)
        try:
            child.wait(timeout=STOP_BOUND + 30)
        except subprocess.TimeoutExpired:
            alive = [p for p in pids if pid_alive(p)]
            raise AssertionError(f"the owner was still running {STOP_BOUND + 30} s after {sig.name}; servers alive: "
                                 f"{alive} of {pids} (control plane's, then the S3 server's)") from None
        # SIGKILL gives Python no chance to clean up; the watchdog does it.
        assert wait_gone(pids, timeout=30) == []
        # The throwaway certificates, keys and data go too (after SIGKILL, the watchdog removes them).
        eventually(lambda: not any(os.path.exists(d) for d in started["dirs"]), 10, "the throwaway directories gone",
                   interval=0.1)
        assert [d for d in started["dirs"] if os.path.exists(d)] == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_stop_ends_every_process_and_is_idempotent():
    from arbiter_devenv.s3server import S3Server

    server = S3Server().start()
    pid = server.pid
    assert pid_alive(pid)
    server.stop()
    server.stop()
    assert not pid_alive(pid)
