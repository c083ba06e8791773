"""Child-process hygiene shared by the development servers: nothing may outlive the Python process that started it.

Three layers, because each covers a way of dying the others miss:
- ``stop()`` on the server (fixture teardown, context manager exit);
- an ``atexit`` hook plus SIGTERM/SIGHUP handlers (installed only where the handler is still the default) that stop
  every live server, then let the signal take its normal course;
- a watchdog process that holds the read end of a pipe: when the owner dies in any way, SIGKILL included, the pipe
  closes and the watchdog kills the registered process groups. A pipe (not PR_SET_PDEATHSIG) because PDEATHSIG
  fires when the *thread* that forked exits, which would kill servers started from a worker thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a server may still lose the race for it; callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_WATCHDOG = r"""
import os, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
dirs = set()
for line in sys.stdin:
    word, _, arg = line.rstrip("\n").partition(" ")
    if word == "add":
        groups.add(int(arg))
    elif word == "forget":
        groups.discard(int(arg))
    elif word == "dir":
        dirs.add(arg)
    elif word == "forget-dir":
        dirs.discard(arg)
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except OSError:
        return False
for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0)):
    for g in list(groups):
        try:
            os.killpg(g, sig)
        except OSError:
            groups.discard(g)
    deadline = time.monotonic() + wait
    while groups and time.monotonic() < deadline:
        groups = {g for g in groups if alive(g)}
        time.sleep(0.1)
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""

_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it
_watchdog: subprocess.Popen[str] | None = None
_watchdog_pid_owner: int | None = None
_live: weakref.WeakSet[object] = weakref.WeakSet()
_hooks_installed = False


def _ensure_watchdog() -> subprocess.Popen[str]:
    global _watchdog, _watchdog_pid_owner
    if _watchdog is not None and _watchdog.poll() is None and _watchdog_pid_owner == os.getpid():
        return _watchdog
    _watchdog = subprocess.Popen(
        [sys.executable, "-I", "-c", _WATCHDOG],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a Ctrl-C to the terminal's process group must not take the watchdog first
    )
    _watchdog_pid_owner = os.getpid()
    return _watchdog


def _tell(message: str) -> None:
    wd = _ensure_watchdog()
    try:
        assert wd.stdin is not None
        wd.stdin.write(message + "\n")
        wd.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def spawn(argv: list[str], *, log_path: os.PathLike[str] | str, env: dict[str, str] | None = None,
          cwd: os.PathLike[str] | str | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group, output to ``log_path``, guarded by the watchdog."""
    with _lock:
        _ensure_watchdog()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                # Own group: Ctrl-C reaches only Python, which then stops the servers in order (apiserver
                # before etcd) instead of both dying at once mid-write.
                start_new_session=True,
            )
        _tell(f"add {proc.pid}")
    return proc


TERM_GRACE_S = 10.0  # how long terminate() waits after SIGTERM
KILL_WAIT_S = 5.0  # and after SIGKILL


def stop_bound(grace: float = TERM_GRACE_S) -> float:
    """The longest terminate(proc, grace=grace) takes (what a test of an owner's stop may wait, plus a margin)."""
    return grace + KILL_WAIT_S


def terminate(proc: subprocess.Popen[bytes] | None, *, grace: float = TERM_GRACE_S) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds, reap, and tell the watchdog."""
    if proc is None:
        return
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    # Leftover children of the group (none expected) go too, before the pgid can be reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with _lock:
        _tell(f"forget {pgid}")


def guard_dir(path: os.PathLike[str] | str) -> None:
    """Have the watchdog remove ``path`` (certificates, keys, data) if the owner dies without cleaning up."""
    with _lock:
        _tell(f"dir {os.fspath(path)}")


def forget_dir(path: os.PathLike[str] | str) -> None:
    with _lock:
        _tell(f"forget-dir {os.fspath(path)}")


def register(server: object, stop: Callable[[], None]) -> None:
    """Remember a live server so that atexit and SIGTERM/SIGHUP stop it."""
    _install_hooks()
    _live.add(server)
    server._devenv_stop = stop  # type: ignore[attr-defined]


def unregister(server: object) -> None:
    _live.discard(server)


def stop_all() -> None:
    for server in list(_live):
        try:
            server._devenv_stop()  # type: ignore[attr-defined]
        except Exception:
            pass


def _on_signal(signum: int, frame: object) -> None:
    stop_all()
    # Die the way the signal meant to: default action, re-raised.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        # Respect handlers somebody else installed (kopf, uvicorn); they end in an orderly exit and atexit.
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (reaped or not, a zombie runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs; return the ones still running at the deadline."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if pid_alive(p)]
    return left
