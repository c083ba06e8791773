"""Run the operator (`python -m arbiter_operator`) as a subprocess against a kubeconfig, for tests and local runs.

    with OperatorProcess(kubeconfig, ["team-a"]) as op:
        ...
        op.writes()        # the operator's own write calls so far (its `kube-write` log lines)
        op.kill()          # SIGKILL, to test restarts; op.start() again afterwards
        op.scrape()        # its /metrics page, when started with metrics=True

With metrics=True the operator serves its metrics on loopback with auth off (--metrics-auth=false, what local
development uses), so op.scrape() needs no token. metrics_auth=True keeps the operator's default: every scrape's
bearer token is judged by the apiserver (op.metrics_get(token) returns the status and body); metrics_cert_dir serves
HTTPS from a tls.crt/tls.key pair (op.metrics_get(token, cafile=...)).

The security tests reuse it with a ServiceAccount kubeconfig to run the operator with its chart's RBAC only.
"""

from __future__ import annotations

import os
import pathlib
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from . import _procs
from ._procs import free_port


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: os.PathLike[str] | str,
        namespaces: list[str],
        *,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        log_dir: os.PathLike[str] | str | None = None,
        metrics: bool = False,
        metrics_auth: bool = False,
        metrics_cert_dir: os.PathLike[str] | str | None = None,
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.namespaces = list(namespaces)
        self.env = dict(env or {})
        self.extra_args = tuple(extra_args)
        self.log_dir = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="arbiter-operator-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.log_path = self.log_dir / "operator-0.log"
        self.port = 0
        self.metrics = metrics
        self.metrics_auth = metrics_auth
        self.metrics_cert_dir = str(metrics_cert_dir) if metrics_cert_dir else ""
        self.metrics_port = 0

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        self.runs += 1
        self.log_path = self.log_dir / f"operator-{self.runs}.log"
        self.port = free_port()
        argv = [sys.executable, "-m", "arbiter_operator", "--kubeconfig", self.kubeconfig,
                "--liveness", f"http://127.0.0.1:{self.port}/healthz", *self.extra_args]
        if self.metrics:
            self.metrics_port = free_port()
            argv += ["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1",
                     f"--metrics-auth={str(self.metrics_auth).lower()}"]
            if self.metrics_cert_dir:
                argv.append(f"--metrics-cert-dir={self.metrics_cert_dir}")
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = _procs.spawn(argv, log_path=self.log_path, env=env)
        _procs.register(self, self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"operator not live after {timeout:.0f}s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        _procs.terminate(self.proc, grace=10.0)
        _procs.unregister(self)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, like a node failure."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def metrics_url(self) -> str:
        if not self.metrics_port:
            raise RuntimeError("started without metrics=True")
        return f"{'https' if self.metrics_cert_dir else 'http'}://127.0.0.1:{self.metrics_port}/metrics"

    def metrics_get(self, token: str | None = None, cafile: os.PathLike[str] | str | None = None) -> tuple[int, str]:
        """(status, body) of one GET of the operator's /metrics, with `token` as its bearer token if given; over
        HTTPS (metrics_cert_dir), `cafile` is the CA that signed the certificate."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ctx = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        req = urllib.request.Request(self.metrics_url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def scrape(self, token: str | None = None, cafile: os.PathLike[str] | str | None = None) -> str:
        """The operator's /metrics page (Prometheus text format); needs metrics=True."""
        status, body = self.metrics_get(token, cafile)
        if status != 200:
            raise RuntimeError(f"the operator's /metrics answered {status}: {body[:500]}")
        return body

    def writes(self) -> list[str]:
        """This run's write calls, as the operator's kube client logged them."""
        return [line for line in self.log().splitlines() if " kube-write " in line]

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
