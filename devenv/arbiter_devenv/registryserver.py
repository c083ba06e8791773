"""A real Kubeflow Model Registry for tests and the dev run command: PostgreSQL (Debian) + the registry server.

- PostgreSQL: `initdb` into a temporary directory, `postgres` on 127.0.0.1 and a free port, its unix socket in the
  same directory, trust authentication (nothing outside this machine can reach it). PostgreSQL refuses to run as
  root, so when we are root (CI is) both programs run as the `postgres` user Debian's package creates (or `nobody`),
  through `setpriv`, which execs in place: the PID we hold is postgres' own, so stopping it is a plain signal.
- The registry: `model-registry proxy --embedmd-database-type postgres --embedmd-database-dsn ...` on another free
  port; it runs its own schema migrations on start. Ready when `/readyz/health` answers 200 (database connected,
  migrations done) and the REST API lists registered models.

    with start_model_registry() as mr:
        mr.url  # http://127.0.0.1:PORT ; API at mr.url + "/api/model_registry/v1alpha3"

    python -m arbiter_devenv.registryserver   # runs one until Ctrl-C, prints the URL
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import _procs
from ._procs import free_port

PG_BIN_CANDIDATES = [pathlib.Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15, 14, 13)]
DB_NAME = "model_registry"
DB_USER = "arbiter"



def pg_bindir() -> pathlib.Path:
    env = os.environ.get("ARBITER_PG_BINDIR")
    if env:
        return pathlib.Path(env)
    for d in PG_BIN_CANDIDATES:
        if (d / "postgres").exists():
            return d
    found = shutil.which("pg_ctl")
    if found:
        return pathlib.Path(found).resolve().parent
    raise RuntimeError(
        "PostgreSQL server binaries not found; install Debian's postgresql package (apt-get install postgresql)"
    )


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as, or None when we are not root (then we run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


def _as_user(argv: list[str], user: pwd.struct_passwd | None) -> list[str]:
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *argv]


def _wait(check, timeout: float, what: str, proc: subprocess.Popen, log: pathlib.Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log:\n{_tail(log)}")
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s; log:\n{_tail(log)}")


def _tail(path: pathlib.Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


_OWN_SIGNAL_S = 20  # how long _stop waits after the server's own orderly signal
_TERM_GRACE_S = 5
STOP_BOUND_S = _OWN_SIGNAL_S + _procs.stop_bound(_TERM_GRACE_S)  # the longest _stop takes, per server


def _stop(proc: subprocess.Popen | None, sig: int, timeout: float = _OWN_SIGNAL_S) -> None:
    """The server's own orderly signal first, then the shared terminate (group SIGTERM/SIGKILL, watchdog forgets)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    _procs.terminate(proc, grace=_TERM_GRACE_S)


@dataclass(eq=False)  # hashable by identity: the devenv registry of live servers holds it
class Postgres:
    workdir: pathlib.Path
    port: int
    proc: subprocess.Popen | None = None
    log: pathlib.Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.workdir / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgres://{DB_USER}@127.0.0.1:{self.port}/{DB_NAME}?sslmode=disable"

    def start(self, timeout: float = 60) -> Postgres:
        bindir = pg_bindir()
        user = _unprivileged_user()
        data = self.workdir / "pgdata"
        sock = self.workdir / "pgsock"
        sock.mkdir()
        if user is not None:
            # The data directory must belong to the user PostgreSQL runs as.
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
            os.chown(sock, user.pw_uid, user.pw_gid)
        with open(self.log, "ab") as log:
            subprocess.run(
                _as_user([str(bindir / "initdb"), "-D", str(data), "-U", DB_USER, "-A", "trust", "-E", "UTF8",
                          "--no-instructions", "--no-sync"], user),
                stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120, cwd=self.workdir,
            )
        # spawn: own process group, and the devenv watchdog kills it if this Python process dies (SIGKILL too).
        self.proc = _procs.spawn(
            _as_user([str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port),
                      "-k", str(sock), "-c", "fsync=off", "-c", "synchronous_commit=off",
                      "-c", "full_page_writes=off", "-c", "max_connections=50"], user),
            log_path=self.log, cwd=self.workdir,
        )
        isready = str(bindir / "pg_isready")
        _wait(
            lambda: subprocess.run([isready, "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", DB_USER],
                                   check=False).returncode == 0,
            timeout, "PostgreSQL", self.proc, self.log,
        )
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", DB_USER, DB_NAME],
            check=True, timeout=30, capture_output=True,
        )
        return self

    def stop(self) -> None:
        # SIGINT is PostgreSQL's "fast" shutdown: roll back open transactions, close, exit.
        _stop(self.proc, signal.SIGINT)


@dataclass(eq=False)
class ModelRegistryServer:
    binary: pathlib.Path
    workdir: pathlib.Path
    postgres: Postgres
    port: int
    proc: subprocess.Popen | None = None
    log: pathlib.Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.workdir / "model-registry.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return self.url + "/api/model_registry/v1alpha3"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz/health", timeout=2) as r:
                if r.status != 200:
                    return False
            with urllib.request.urlopen(self.api_url + "/registered_models?pageSize=1", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 90) -> ModelRegistryServer:
        self.proc = _procs.spawn(
            [str(self.binary), "proxy", "--hostname", "127.0.0.1", "--port", str(self.port),
             "--embedmd-database-type", "postgres", "--embedmd-database-dsn", self.postgres.dsn],
            log_path=self.log, cwd=self.workdir,
            # The server reads $HOME/.model-registry.yaml when present; keep it from picking up anything.
            env={**os.environ, "HOME": str(self.workdir)},
        )
        _wait(self._ready, timeout, "model registry", self.proc, self.log)
        return self

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)

    # For tests of outages: the registry goes away and comes back on the same port and database.
    def pause(self) -> None:
        self.stop()

    def resume(self, timeout: float = 90) -> None:
        self.start(timeout)


def registry_binary() -> pathlib.Path:
    from .tools import ensure_tool

    return ensure_tool("model-registry")


@contextlib.contextmanager
def start_model_registry(binary: pathlib.Path | None = None, keep_dir: bool = False) -> Iterator[ModelRegistryServer]:
    binary = binary or registry_binary()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="arbiter-registry-"))
    os.chmod(workdir, 0o755)  # the PostgreSQL user must be able to enter it
    pg = Postgres(workdir=workdir / "pg", port=free_port())
    pg.workdir.mkdir()
    server: ModelRegistryServer | None = None
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        if server is not None:
            server.stop()  # before its database
        pg.stop()
        _procs.unregister(pg)
        if not keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)

    try:
        _procs.register(pg, stop)  # atexit / SIGTERM stop both, in order
        pg.start()
        server = ModelRegistryServer(binary=binary, workdir=workdir, postgres=pg, port=free_port()).start()
        yield server
    finally:
        stop()


def main() -> int:
    with start_model_registry() as mr:
        print(f"model registry: {mr.url}  (API {mr.api_url}); logs in {mr.workdir}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
