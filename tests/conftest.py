"""Shared fixtures: a real cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok's simulated
GPU nodes and the real KServe controller with its webhooks) with the upstream CRDs installed, a fresh namespace per
test, a real S3 server (SeaweedFS) and a real Prometheus. One of each per session (per pytest-xdist worker), shared by
every test that does not need its own; see docs/devenv.md.

Cluster choice, in order: ARBITER_TEST_KUBECONFIG (an existing cluster; nothing is started), ``--kind`` (a kind
cluster through pytest-kind, needs Docker), else the local control plane built from hack/tools.
S3 choice: ARBITER_TEST_S3_ENDPOINT_URL (+ _ACCESS_KEY, _SECRET_KEY, _REGION) for an existing S3, else the local
SeaweedFS.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv import crds
from arbiter_devenv.cluster import LocalCluster, wait_default_service_account
from arbiter_devenv.controlplane import ExistingCluster
from arbiter_devenv.s3server import S3Server
from arbiter_devenv.tools import ensure_tool, load_tool

# Fixtures shared by tests in several folders (unit and cluster), registered here, their common parent.
pytest_plugins = ["support.runtime_fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("arbiter")
    group.addoption(
        "--kind",
        action="store_true",
        default=False,
        help="run cluster tests on a kind cluster (pytest-kind, Docker) instead of the local control plane",
    )


# tryfirst: the xdist_group marks must be on the items before pytest-xdist reads them (its own hook of this name).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Whatever uses the control plane is a cluster test, marked or not, so `-m "not cluster"` is reliable.
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
    # pytest-xdist with --dist loadgroup (hack/test.sh): the tests of a module that share a module-scoped server stay
    # on one worker, so it starts once; every other test goes to whichever worker is free.
    # (A worker sees --dist as "no" and pytest-xdist's own `loadgroup` flag instead.)
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup":
        for item in items:
            if not any(item.iter_markers("xdist_group")) and _uses_module_scope(item):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


class _GroupIds:
    """pytest-xdist 3.8 groups a worker's tests for --dist loadgroup by appending `@<group>` to each marked item's
    `_nodeid`; pytest 9 reads an item's id from `_id` instead, so the suffix never reached the scheduler and every
    test went to whichever worker was free: a module-scoped server or build was set up once per worker (the operator
    image's build stage three times, 61-68 s each on a 2-core machine). This gives the id the suffix where xdist's
    assignment did not take, after xdist's own hook, in the form xdist's scheduler splits on."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        for item in items:
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")})
            node_id = getattr(item, "_id", None)
            if names and node_id is not None and "@" not in item.nodeid:
                item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: where the items are collected and named
        config.pluginmanager.register(_GroupIds(), "arbiter-xdist-group-ids")


def _uses_module_scope(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "package", "class"):
            return True
    return False


def pytest_collection_finish(session: pytest.Session) -> None:
    # Build missing binaries before the first test, outside any per-test timeout: a cold kube-apiserver build takes
    # about ten minutes on a small machine. Cached binaries make this a few stat() calls.
    if session.config.option.collectonly:
        return
    used = set()
    for item in session.items:
        used.update(getattr(item, "fixturenames", ()))
    needed = []
    local_cluster = not os.environ.get("ARBITER_TEST_KUBECONFIG") and not session.config.getoption("--kind")
    if "control_plane" in used and local_cluster:
        needed += ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kserve-controller"]
    if "s3_server" in used and not os.environ.get("ARBITER_TEST_S3_ENDPOINT_URL"):
        needed.append("seaweedfs")
    if "argocd" in used:
        needed.append("argocd")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for name in needed:
        tool = load_tool(name)
        if not tool.is_cached() and reporter is not None:
            reporter.write_line(f"arbiter: building {name} {tool.version} with go build (first run only; minutes)")
        ensure_tool(name, quiet=True)


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A cluster with KServe, OpenShift Route, ModelRegistry and Arbiter's CRDs Established.

    Local default: ``LocalCluster`` (``.kubeconfig``, ``.server``, ``.api_client()``, ``.write_kubeconfig()``, and
    ``.set_fate(ns, isvc, fate)`` / ``.add_pool(NodePool(...))`` to steer kwok's simulated pods and nodes).
    """
    kind_cluster = None
    existing = os.environ.get("ARBITER_TEST_KUBECONFIG")
    if existing:
        cluster: Any = ExistingCluster(existing)
    elif request.config.getoption("--kind"):
        if not _docker_works():
            pytest.fail("--kind needs a working Docker daemon (`docker info` failed)")
        try:
            from pytest_kind import KindCluster
        except ImportError:
            pytest.fail("--kind needs pytest-kind: .venv/bin/pip install -e '.[kind]'")
        # One kind cluster per pytest-xdist worker (each worker has its own session).
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        kind_cluster = KindCluster(f"arbiter-test-{worker}" if worker else "arbiter-test")
        kind_cluster.create()
        cluster = ExistingCluster(kind_cluster.kubeconfig_path)
    else:
        cluster = LocalCluster().start()
    try:
        api = cluster.api_client()
        try:
            # Upstream CRDs on somebody else's cluster are theirs: create missing ones, never replace. The local
            # cluster installed KServe's already (its controller needs them before it starts).
            ours = not existing and not isinstance(cluster, LocalCluster)
            crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=ours)
            crds.install_crds(api, crds.arbiter_crd_paths())
        finally:
            api.close()
        yield cluster
    finally:
        cluster.stop()
        if kind_cluster is not None:
            kind_cluster.delete()


@pytest.fixture
def namespace(control_plane: Any) -> Iterator[str]:
    """A fresh namespace, returned once the controller-manager has created its ``default`` ServiceAccount (the
    ServiceAccount admission plugin rejects pods before that); deleted afterwards (the namespace controller removes
    what is in it) without waiting.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    name = f"t-{uuid.uuid4().hex[:10]}"
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    try:
        meta = client.V1ObjectMeta(name=name, labels={"arbiter.dev/test": "true"})
        core.create_namespace(client.V1Namespace(metadata=meta))
        wait_default_service_account(api, name)
        yield name
    finally:
        try:
            core.delete_namespace(name, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise
        finally:
            api.close()


@dataclasses.dataclass
class ExternalS3:
    endpoint_url: str
    access_key: str
    secret_key: str = dataclasses.field(repr=False)
    region: str = "us-east-1"

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=self.region,
            config=Config(s3={"addressing_style": "path"}),
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A real S3 endpoint: ``.endpoint_url``, ``.access_key``, ``.secret_key``, ``.region``, ``.client()``."""
    url = os.environ.get("ARBITER_TEST_S3_ENDPOINT_URL")
    if url:
        yield ExternalS3(
            url,
            os.environ["ARBITER_TEST_S3_ACCESS_KEY"],
            os.environ["ARBITER_TEST_S3_SECRET_KEY"],
            os.environ.get("ARBITER_TEST_S3_REGION", "us-east-1"),
        )
        return
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prometheus_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real Prometheus for the session (per pytest-xdist worker), scraping the stand-ins tests add under their
    own namespace (support.promstack.module_stack gives it to a module as `stack`)."""
    from support.promstack import PromStack

    stack = PromStack(tmp_path_factory.mktemp("prometheus"))
    try:
        yield stack.start()
    finally:
        stack.stop()
