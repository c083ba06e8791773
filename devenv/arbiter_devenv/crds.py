"""The CustomResourceDefinitions Arbiter's operator writes to, installed into a development or test cluster.

Upstream CRDs come from the Go module cache (``go mod download -json MODULE@VERSION``) at pinned versions, so they
are the real schemas and are never committed here:
- KServe v0.17.0: InferenceService (serving.kserve.io/v1beta1) and ServingRuntime (v1alpha1), full schema;
- OpenShift API: Route (route.openshift.io/v1) from route/v1/zz_generated.crd-manifests/;
- prometheus-operator v0.85.0: PodMonitor (monitoring.coreos.com/v1).
The Model Registry operator's ModelRegistry CRD is not served by the module proxy; a hand-written stand-in lives in
tests/crds/ (see docs/devenv.md). Arbiter's own CRDs are whatever is in crds/*.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import yaml

from .tools import repo_root

__all__ = [
    "KSERVE",
    "OPENSHIFT_API",
    "PROMETHEUS_OPERATOR",
    "UPSTREAM",
    "CRDError",
    "GoModuleFiles",
    "all_crd_paths",
    "arbiter_crd_paths",
    "install_crds",
    "load_crds",
    "stand_in_crd_paths",
    "upstream_crd_paths",
]


class CRDError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class GoModuleFiles:
    """Files inside one pinned Go module version."""

    module: str
    version: str
    files: tuple[str, ...]

    def download(self) -> pathlib.Path:
        """``go mod download`` the module (a no-op when cached) and return its directory in the module cache."""
        go = shutil.which("go")
        if go is None:
            raise CRDError(f"fetching {self.module}@{self.version} needs the Go toolchain on PATH")
        # Outside any module: the download must not consult or edit a go.mod of ours.
        with tempfile.TemporaryDirectory(prefix="arbiter-gomod-") as empty:
            env = dict(os.environ, GO111MODULE="on", GOFLAGS="-mod=mod")
            proc = subprocess.run(
                [go, "mod", "download", "-json", f"{self.module}@{self.version}"],
                cwd=empty, env=env, capture_output=True, text=True,
            )
        try:
            info = json.loads(proc.stdout)
        except json.JSONDecodeError:
            info = {"Error": (proc.stderr or proc.stdout).strip()}
        if proc.returncode != 0 or info.get("Error") or not info.get("Dir"):
            raise CRDError(f"go mod download {self.module}@{self.version} failed: {info.get('Error') or proc.stderr}")
        return pathlib.Path(info["Dir"])

    def paths(self) -> list[pathlib.Path]:
        root = self.download()
        out = []
        for rel in self.files:
            p = root / rel
            if not p.is_file():
                raise CRDError(f"{self.module}@{self.version} has no {rel}")
            out.append(p)
        return out


KSERVE = GoModuleFiles(
    "github.com/kserve/kserve",
    "v0.17.0",
    (
        "config/crd/full/serving.kserve.io_inferenceservices.yaml",
        "config/crd/full/serving.kserve.io_servingruntimes.yaml",
    ),
)
# openshift/api has no releases; this is the newest pseudo-version the module proxy lists (@v/list).
OPENSHIFT_API = GoModuleFiles(
    "github.com/openshift/api",
    "v0.0.0-20260709102940-580f1c1ba691",
    ("route/v1/zz_generated.crd-manifests/routes.crd.yaml",),
)
# prometheus-operator: PodMonitor and PrometheusRule (monitoring.coreos.com/v1), which the operator renders where
# the API is served.
# v0.85.0: the proxy serves it (it has no @v/list for this module; v0.86.0 is not available there).
PROMETHEUS_OPERATOR = GoModuleFiles(
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    ("example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
     "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"),
)
UPSTREAM = (KSERVE, OPENSHIFT_API, PROMETHEUS_OPERATOR)


def upstream_crd_paths() -> list[pathlib.Path]:
    return [p for source in UPSTREAM for p in source.paths()]


def stand_in_crd_paths() -> list[pathlib.Path]:
    """Hand-written CRDs for upstream projects whose CRDs cannot be fetched (ModelRegistry)."""
    return sorted((repo_root() / "tests" / "crds").glob("*.yaml"))


def arbiter_crd_paths() -> list[pathlib.Path]:
    return sorted((repo_root() / "crds").glob("*.yaml"))


def all_crd_paths() -> list[pathlib.Path]:
    return upstream_crd_paths() + stand_in_crd_paths() + arbiter_crd_paths()


def load_crds(paths: Iterable[os.PathLike[str] | str]) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the KServe CRD is 1 MB of YAML; libyaml is 10x faster
    out = []
    for path in paths:
        with open(path) as fh:
            for doc in yaml.load_all(fh, Loader=loader):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    out.append(doc)
    return out


def install_crds(
    api_client: Any, paths: Iterable[os.PathLike[str] | str], *, replace: bool = True, timeout: float = 60.0
) -> list[str]:
    """Create every CRD in ``paths`` (replace existing ones when ``replace``) and wait until each is Established and
    served. Pass ``replace=False`` on a cluster you do not own, so its KServe or OpenShift CRDs stay as they are.

    Returns the CRD names. Responses are read as raw JSON: the generated client models are slow on a 1 MB schema.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    crds = load_crds(paths)
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(body=crd, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise CRDError(f"creating CRD {name}: {exc.status} {exc.reason}: {exc.body}") from exc
            if not replace:
                continue
            current = json.loads(ext.read_custom_resource_definition(name, _preload_content=False).data)
            body = dict(crd)
            body["metadata"] = dict(crd["metadata"], resourceVersion=current["metadata"]["resourceVersion"])
            ext.replace_custom_resource_definition(name, body=body, _preload_content=False)

    custom = client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + timeout
    for crd in crds:
        name = crd["metadata"]["name"]
        # First wait until a list answers (what clients need; Established alone can precede the REST handler),
        # polling the small list instead of re-reading a CRD that can be 1 MB; then confirm Established once.
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served")):
            while True:
                try:
                    custom.list_cluster_custom_object(group, version, plural, limit=1, _preload_content=False)
                    break
                except ApiException as exc:
                    if exc.status != 404 or time.monotonic() > deadline:
                        raise CRDError(f"{plural}.{group}/{version} not served: {exc.status} {exc.reason}") from exc
                    time.sleep(0.1)
        while True:
            current = json.loads(ext.read_custom_resource_definition(name, _preload_content=False).data)
            conditions = {c["type"]: c for c in (current.get("status") or {}).get("conditions") or []}
            if conditions.get("Established", {}).get("status") == "True":
                break
            if time.monotonic() > deadline:
                raise CRDError(f"CRD {name} not Established after {timeout:.0f}s: {list(conditions.values())}")
            time.sleep(0.25)
    return [c["metadata"]["name"] for c in crds]
