"""Argo CD on the local cluster, for the GitOps tests: Redis (Debian's ``redis-server``), Argo CD's repo server and
application controller (the multicall binary built from hack/tools/argocd), Argo CD's CRDs from its Go module, the
``argocd`` namespace with ``argocd-cm`` holding the DecisionModel health check the way users install it, and a Git
repository served from the local file system (``file://`` URLs, which Argo CD's repo server reads with plain git).

    with ArgoCD(cluster) as argo:                       # cluster: LocalCluster (or anything with .api_client())
        repo = GitRepo(tmp_path / "git")
        repo.commit({"models/dm.yaml": text}, "first model")
        argo.create_application("team", repo.url, "models", namespace="team")
        argo.refresh("team")                            # what a Git webhook does after a push
        argo.application("team")["status"]["health"]

No Argo CD API server, UI or Dex: the controller and the repo server are what syncs and judges health. Every
process listens on 127.0.0.1 only; ``stop()`` ends each of them. Logs: ``workdir/{redis,repo-server,
application-controller}.log``.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from . import _procs
from .crds import GoModuleFiles, install_crds
from .tools import ensure_tool, load_tool, repo_root

__all__ = ["ARGOCD_NAMESPACE", "ArgoCD", "ArgoCDError", "GitRepo", "argocd_crds", "health_check_lua"]

ARGOCD_NAMESPACE = "argocd"
HEALTH_KEY = "resource.customizations.health.arbiter.dev_DecisionModel"
ARGO_GROUP, ARGO_VERSION = "argoproj.io", "v1alpha1"


class ArgoCDError(RuntimeError):
    pass


def argocd_crds() -> GoModuleFiles:
    """Argo CD's Application and AppProject CRDs, from the same module version the binary is built from."""
    return GoModuleFiles(
        "github.com/argoproj/argo-cd/v3",
        load_tool("argocd").version,
        ("manifests/crds/application-crd.yaml", "manifests/crds/appproject-crd.yaml"),
    )


def health_check_lua() -> str:
    """The DecisionModel health check the chart ships (helm/arbiter/health/decisionmodel.lua)."""
    return (repo_root() / "helm" / "arbiter" / "health" / "decisionmodel.lua").read_text()


def _git(*args: str, cwd: os.PathLike[str] | str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "arbiter-test", "GIT_AUTHOR_EMAIL": "test@arbiter.invalid",
           "GIT_COMMITTER_NAME": "arbiter-test", "GIT_COMMITTER_EMAIL": "test@arbiter.invalid",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": os.fspath(cwd or tempfile.gettempdir())}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ArgoCDError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


class GitRepo:
    """A bare repository (what Argo CD reads, at ``url``) and a working clone the test commits from."""

    def __init__(self, root: os.PathLike[str] | str, branch: str = "main") -> None:
        self.root = pathlib.Path(root)
        self.branch = branch
        self.bare = self.root / "origin.git"
        self.work = self.root / "work"
        self.root.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", f"--initial-branch={branch}", str(self.bare))
        _git("init", "-q", f"--initial-branch={branch}", str(self.work))
        _git("remote", "add", "origin", str(self.bare), cwd=self.work)

    @property
    def url(self) -> str:
        return self.bare.resolve().as_uri()

    def commit(self, files: dict[str, str], message: str) -> str:
        """Write ``files`` (path -> text) into the clone, commit, push; returns the commit's SHA."""
        for rel, text in files.items():
            path = self.work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            _git("add", rel, cwd=self.work)
        _git("commit", "-q", "-m", message, cwd=self.work)
        _git("push", "-q", "origin", f"HEAD:{self.branch}", cwd=self.work)
        return _git("rev-parse", "HEAD", cwd=self.work)


def _wait_port(port: int, proc: Any, log: pathlib.Path, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ArgoCDError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise ArgoCDError(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f}s:\n{_tail(log)}")


def _wait_http(url: str, proc: Any, log: pathlib.Path, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ArgoCDError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise ArgoCDError(f"{what} not healthy at {url} after {timeout:.0f}s:\n{_tail(log)}")


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class ArgoCD:
    """See the module docstring. ``app_resync`` is the controller's poll of Git (seconds; Argo CD's default is 120):
    tests call ``refresh()`` after a push instead, as a Git webhook would."""

    def __init__(self, cluster: Any, *, workdir: os.PathLike[str] | str | None = None, app_resync: int = 120,
                 start_timeout: float = 120.0, log_level: str = "info") -> None:
        self.cluster = cluster
        self._given_workdir = pathlib.Path(workdir) if workdir else None
        self._sockets: pathlib.Path | None = None
        self.workdir: pathlib.Path | None = None
        self.app_resync = app_resync
        self.start_timeout = start_timeout
        self.log_level = log_level
        self.namespace = ARGOCD_NAMESPACE
        self._redis: Any = None
        self._repo_server: Any = None
        self._controller: Any = None
        self.redis_port = 0
        self.repo_server_port = 0
        self.controller_metrics_port = 0
        self._redis_password = ""
        self.timings: dict[str, float] = {}

    def __enter__(self) -> ArgoCD:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in (("redis", self._redis), ("repo-server", self._repo_server),
                                            ("application-controller", self._controller)) if p is not None}

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> ArgoCD:
        if self._controller is not None:
            return self
        redis = shutil.which("redis-server")
        if redis is None:
            raise ArgoCDError("Argo CD needs Redis: install Debian's redis-server (hack/setup.sh does)")
        if shutil.which("git") is None:
            raise ArgoCDError("Argo CD's repo server needs git on PATH")
        binary = ensure_tool("argocd")
        self.workdir = self._given_workdir or pathlib.Path(tempfile.mkdtemp(prefix="arbiter-argocd-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._given_workdir is None:
            _procs.guard_dir(self.workdir)
        _procs.register(self, self.stop)
        try:
            started = time.monotonic()
            self._install()
            self.timings["install"] = time.monotonic() - started
            started = time.monotonic()
            self._start_redis(redis)
            self._start_repo_server(binary)
            self._start_controller(binary)
            self.timings["processes"] = time.monotonic() - started
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # Controller first (it calls the repo server and Redis), Redis last.
        for attr in ("_controller", "_repo_server", "_redis"):
            _procs.terminate(getattr(self, attr), grace=10.0)
            setattr(self, attr, None)
        _procs.unregister(self)
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            _procs.forget_dir(self.workdir)

    def check(self) -> None:
        """Raise with the log tail when a process has exited."""
        assert self.workdir is not None
        for name, proc in (("redis", self._redis), ("repo-server", self._repo_server),
                           ("application-controller", self._controller)):
            if proc is not None and proc.poll() is not None:
                raise ArgoCDError(f"{name} exited with {proc.returncode}:\n{_tail(self.workdir / f'{name}.log')}")

    def _env(self, name: str) -> dict[str, str]:
        assert self.workdir is not None
        base = self.workdir / name
        for sub in ("tmp", "tls", "ssh", "gpg"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        return {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")},
            "HOME": str(base),
            "TMPDIR": str(base / "tmp"),
            "ARGOCD_BINARY_NAME": name,
            # Outside a pod: the in-cluster destination (https://kubernetes.default.svc) is this kubeconfig.
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "KUBECONFIG": str(self._kubeconfig),
            "REDIS_PASSWORD": self._redis_password,
            "ARGOCD_TLS_DATA_PATH": str(base / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(base / "ssh"),
            "ARGOCD_GNUPGHOME": str(base / "gpg"),
            "ARGOCD_GPG_ENABLED": "false",
            # The repo server's git credential socket: /tmp/reposerver-ask-pass.sock by default, one path for every
            # instance on the machine, so a second instance (or one a killed run left) fails with "address already in
            # use". A short path of this instance's own (a unix socket path holds at most 107 bytes).
            "ARGOCD_ASK_PASS_SOCK": str(self._socket_dir() / "ask-pass.sock"),
        }

    def _socket_dir(self) -> pathlib.Path:
        if self._sockets is None:
            self._sockets = pathlib.Path(tempfile.mkdtemp(prefix="argocd-", dir="/tmp"))
        return self._sockets

    def _start_redis(self, redis: str) -> None:
        assert self.workdir is not None
        self._redis_password = secrets.token_hex(16)
        self.redis_port = _procs.free_port()
        conf = self.workdir / "redis.conf"
        # A cache only: no persistence, loopback, a password (Argo CD reads it from REDIS_PASSWORD).
        conf.write_text(
            f"port {self.redis_port}\nbind 127.0.0.1\nprotected-mode yes\nsave \"\"\nappendonly no\n"
            f"dir {self.workdir}\nrequirepass {self._redis_password}\n"
        )
        conf.chmod(0o600)
        log = self.workdir / "redis.log"
        self._redis = _procs.spawn([redis, str(conf)], log_path=log)
        _wait_port(self.redis_port, self._redis, log, "redis-server", self.start_timeout)

    def _start_repo_server(self, binary: pathlib.Path) -> None:
        assert self.workdir is not None
        self.repo_server_port = _procs.free_port()
        metrics = _procs.free_port()
        log = self.workdir / "repo-server.log"
        self._repo_server = _procs.spawn(
            [str(binary), "--address", "127.0.0.1", "--port", str(self.repo_server_port),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics),
             "--redis", f"127.0.0.1:{self.redis_port}", "--disable-tls", "--logformat", "text",
             "--loglevel", self.log_level],
            log_path=log, env=self._env("argocd-repo-server"), cwd=self.workdir,
        )
        _wait_port(self.repo_server_port, self._repo_server, log, "argocd-repo-server", self.start_timeout)

    def _start_controller(self, binary: pathlib.Path) -> None:
        assert self.workdir is not None
        self.controller_metrics_port = _procs.free_port()
        log = self.workdir / "application-controller.log"
        self._controller = _procs.spawn(
            [str(binary), "--namespace", self.namespace,
             "--repo-server", f"127.0.0.1:{self.repo_server_port}", "--repo-server-plaintext",
             "--redis", f"127.0.0.1:{self.redis_port}",
             "--metrics-port", str(self.controller_metrics_port),
             "--app-resync", str(self.app_resync), "--logformat", "text", "--loglevel", self.log_level,
             # Each resource's health (with the health check's message) in the Application's status, as
             # `controller.resource.health.persist: "true"` in argocd-cmd-params-cm does; Argo CD 3 otherwise keeps it
             # in Redis for its UI only.
             "--persist-resource-health"],
            # One replica: no sharding, no shard ConfigMap.
            log_path=log, env={**self._env("argocd-application-controller"), "ARGOCD_CONTROLLER_REPLICAS": "1"},
            cwd=self.workdir,
        )
        _wait_http(f"http://127.0.0.1:{self.controller_metrics_port}/healthz", self._controller, log,
                   "argocd-application-controller", self.start_timeout)

    # -- what Argo CD reads from the cluster ------------------------------------------------------------------------
    @property
    def _kubeconfig(self) -> pathlib.Path:
        assert self.workdir is not None
        path = self.workdir / "argocd.kubeconfig"
        if not path.exists():
            # Its own client certificate where the cluster can issue one (the apiserver's audit log then tells Argo
            # CD's requests apart); an existing cluster's kubeconfig otherwise.
            cp = getattr(self.cluster, "control_plane", None)
            if cp is not None and hasattr(cp, "write_client_kubeconfig"):
                cp.write_client_kubeconfig(path, "argocd-application-controller")
            else:
                shutil.copyfile(self.cluster.kubeconfig, path)
        return path

    def _install(self) -> None:
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            install_crds(api, argocd_crds().paths())
            core = client.CoreV1Api(api)
            _create(lambda: core.create_namespace({"metadata": {"name": self.namespace}}))
            labels = {"app.kubernetes.io/part-of": "argocd"}
            _apply_cm(core, self.namespace, "argocd-cm", labels, {
                # The way docs/argocd.md tells users to install it.
                HEALTH_KEY: health_check_lua(),
                "application.resourceTrackingMethod": "annotation",
            })
            _apply_cm(core, self.namespace, "argocd-rbac-cm", labels, {"policy.default": "role:readonly"})
            _create(lambda: core.create_namespaced_secret(self.namespace, {
                "metadata": {"name": "argocd-secret", "labels": labels},
                "stringData": {"server.secretkey": secrets.token_urlsafe(32)},
            }))
            objs = client.CustomObjectsApi(api)
            _create(lambda: objs.create_namespaced_custom_object(ARGO_GROUP, ARGO_VERSION, self.namespace,
                                                                 "appprojects", {
                "apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}", "kind": "AppProject",
                "metadata": {"name": "default"},
                "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
            }))
        finally:
            api.close()

    # -- Applications ----------------------------------------------------------------------------------------------
    def create_application(self, name: str, repo_url: str, path: str, *, namespace: str, self_heal: bool = True,
                           automated: bool = True, revision: str = "main",
                           sync_options: list[str] | None = None,
                           ignore_differences: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        from kubernetes import client

        spec: dict[str, Any] = {
            "project": "default",
            "source": {"repoURL": repo_url, "path": path, "targetRevision": revision},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
        }
        if automated:
            spec["syncPolicy"] = {"automated": {"prune": True, "selfHeal": self_heal}}
        if sync_options:
            spec.setdefault("syncPolicy", {})["syncOptions"] = list(sync_options)
        if ignore_differences:
            spec["ignoreDifferences"] = ignore_differences
        body = {"apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}", "kind": "Application",
                "metadata": {"name": name, "namespace": self.namespace}, "spec": spec}
        api = self.cluster.api_client()
        try:
            return client.CustomObjectsApi(api).create_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, self.namespace, "applications", body)
        finally:
            api.close()

    def application(self, name: str) -> dict[str, Any]:
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            return client.CustomObjectsApi(api).get_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, self.namespace, "applications", name)
        finally:
            api.close()

    def refresh(self, name: str, hard: bool = False) -> None:
        """Ask the controller to compare with Git now: the annotation Argo CD's webhook handler and `argocd app get
        --refresh` set."""
        self.annotate(name, "argocd.argoproj.io/refresh", "hard" if hard else "normal")

    def annotate(self, name: str, key: str, value: str) -> None:
        """Set an annotation on Application ``name`` (e.g. ``argocd.argoproj.io/compare-options``)."""
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, self.namespace, "applications", name,
                {"metadata": {"annotations": {key: value}}}, _content_type="application/merge-patch+json")
        finally:
            api.close()

    def delete_application(self, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = self.cluster.api_client()
        try:
            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, self.namespace, "applications", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        finally:
            api.close()

    def log(self, name: str = "application-controller") -> str:
        assert self.workdir is not None
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _create(call: Any) -> None:
    from kubernetes.client.rest import ApiException

    try:
        call()
    except ApiException as exc:
        if exc.status != 409:
            raise


def _apply_cm(core: Any, namespace: str, name: str, labels: dict[str, str], data: dict[str, str]) -> None:
    from kubernetes.client.rest import ApiException

    body = {"metadata": {"name": name, "labels": labels}, "data": data}
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, body)


def main() -> int:
    """``python -m arbiter_devenv.argocd KUBECONFIG``: Argo CD against an existing (local) cluster."""
    import signal
    import sys

    from .controlplane import ExistingCluster

    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    argo = ArgoCD(ExistingCluster(sys.argv[1]))
    argo.start()
    print(json.dumps({"workdir": str(argo.workdir), "pids": argo.pids, "timings": argo.timings}), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        argo.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
