"""The Operator Lifecycle Manager on the local control plane, without containers: OLM's own olm-operator and
catalog-operator (built from github.com/operator-framework/operator-lifecycle-manager) and the file-based catalog
served by `opm serve` (github.com/operator-framework/operator-registry), as processes.

Why network namespaces: both OLM operators bind their health/metrics server on ":8080" (every interface, not
configurable), and `opm serve` binds ":PORT". Each runs in a network namespace of its own (`unshare --net`), where
that wildcard address is reachable from nowhere else; the apiserver is reached through a forwarder pair (TCP on the
namespace's 127.0.0.1:<apiserver port> -> a Unix socket -> the host's 127.0.0.1:<apiserver port>), so the kubeconfig
and its TLS names are unchanged. The catalog operator and opm share one namespace, so the CatalogSource's
`address: 127.0.0.1:50051` reaches opm without a registry Pod.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import time
from urllib.parse import urlparse

CATALOG_PORT = 50051


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listen: str, target: str) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            if target.startswith("unix:"):
                tr, tw = await asyncio.open_unix_connection(target[5:])
            else:
                host, port = target.rsplit(":", 1)
                tr, tw = await asyncio.open_connection(host, int(port))
        except OSError:
            w.close()
            return
        await asyncio.gather(_pump(r, tw), _pump(tr, w))

    if listen.startswith("unix:"):
        server = await asyncio.start_unix_server(handle, listen[5:])
    else:
        host, port = listen.rsplit(":", 1)
        server = await asyncio.start_server(handle, host, int(port))
    async with server:
        await server.serve_forever()


def forward_main(argv: list[str]) -> int:
    """`python -m arbiter_devenv.olm forward LISTEN TARGET` (each `unix:PATH` or `HOST:PORT`)."""
    asyncio.run(_serve(argv[0], argv[1]))
    return 0


class NetNamespace:
    """A network namespace held open by a sleeping process; `run()` starts commands inside it."""

    def __init__(self, workdir: pathlib.Path, name: str, api_port: int, api_socket: pathlib.Path) -> None:
        self.workdir, self.name = workdir, name
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], start_new_session=True)
        time.sleep(0.2)
        subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", "ip", "link", "set", "lo", "up"], check=True,
                       timeout=30)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.run("forward", [sys.executable, "-m", "arbiter_devenv.olm", "forward",
                             f"127.0.0.1:{api_port}", f"unix:{api_socket}"])
        self.wait_listening(api_port)

    def wait_listening(self, port: int, timeout: float = 60.0) -> None:
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()"
        deadline = time.monotonic() + timeout
        while subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", sys.executable, "-c", probe],
                             capture_output=True, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} in network namespace {self.name}")
            time.sleep(0.2)

    def run(self, label: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{self.name}-{label}.log", "wb")
        proc = subprocess.Popen(["nsenter", "-t", str(self.holder.pid), "-n", *cmd], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir, env=env)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in [*self.procs, self.holder]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.procs, self.holder]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


class LocalOLM:
    """olm-operator, catalog-operator and `opm serve CATALOG` against `kubeconfig`; the global catalog namespace is
    `olm` (CatalogSources there are visible to every namespace)."""

    def __init__(self, kubeconfig: pathlib.Path, server: str, workdir: pathlib.Path, catalog_dir: pathlib.Path,
                 binaries: dict[str, pathlib.Path]) -> None:
        self.kubeconfig, self.workdir, self.catalog_dir, self.bin = kubeconfig, workdir, catalog_dir, binaries
        self.api_port = urlparse(server).port or 443
        self.api_socket = workdir / "apiserver.sock"
        self.namespaces: list[NetNamespace] = []
        self.host_forward: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalOLM:
        self.host_forward = subprocess.Popen(
            [sys.executable, "-m", "arbiter_devenv.olm", "forward", f"unix:{self.api_socket}",
             f"127.0.0.1:{self.api_port}"], start_new_session=True,
            stdout=open(self.workdir / "host-forward.log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.api_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the apiserver forwarder did not start")
            time.sleep(0.1)
        kc = str(self.kubeconfig)
        catalog_ns = NetNamespace(self.workdir, "catalog", self.api_port, self.api_socket)
        self.namespaces.append(catalog_ns)
        catalog_ns.run("opm", [str(self.bin["opm"]), "serve", str(self.catalog_dir), "--port", str(CATALOG_PORT),
                               "--termination-log", str(self.workdir / "opm-termination.log")])
        catalog_ns.wait_listening(CATALOG_PORT)
        catalog_ns.run("catalog-operator", [str(self.bin["olm-catalog"]), "--kubeconfig", kc, "--namespace", "olm",
                                            "--writeStatusName", "", "--interval", "30s"])
        olm_ns = NetNamespace(self.workdir, "olm", self.api_port, self.api_socket)
        self.namespaces.append(olm_ns)
        olm_ns.run("olm-operator", [str(self.bin["olm"]), "--namespace", "olm", "--writeStatusName", "",
                                    "--writePackageServerStatusName", "", "--interval", "30s"],
                   env={**os.environ, "KUBECONFIG": kc, "OPERATOR_NAMESPACE": "olm", "OPERATOR_NAME": "olm-operator"})
        return self

    def check(self) -> None:
        for ns in self.namespaces:
            for proc in ns.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[-1] if proc.args else proc} exited ({proc.returncode}); "
                                       f"logs in {self.workdir}")

    def stop(self) -> None:
        for ns in self.namespaces:
            ns.stop()
        if self.host_forward is not None and self.host_forward.poll() is None:
            os.killpg(self.host_forward.pid, signal.SIGTERM)
            self.host_forward.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["forward"]:
        return forward_main(args[1:])
    print("usage: python -m arbiter_devenv.olm forward LISTEN TARGET", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
