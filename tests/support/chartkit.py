"""Helpers shared by tests/cluster/helm and tests/cluster/security: run the real `helm` binary on the chart, and
judge pod specs
against OpenShift's restricted-v2 SCC / Pod Security "restricted".

`helm` is built from its Go module by hack/tools/helm (arbiter_devenv.tools.ensure_tool), never mocked.
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from support.paths import REPO

CHART = REPO / "helm" / "arbiter"
RELEASE = "arbiter"
RELEASE_NAMESPACE = "arbiter-system"


@functools.cache
def helm_binary() -> pathlib.Path:
    from arbiter_devenv.tools import ensure_tool

    return ensure_tool("helm")


@functools.cache
def _helm_home() -> pathlib.Path:
    # helm writes its cache/config/data under $HOME by default; keep the tests off the user's.
    return pathlib.Path(tempfile.mkdtemp(prefix="arbiter-helm-home-"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    home = _helm_home()
    env = dict(os.environ)
    env.update(
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    proc = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def _values_args(values: Mapping[str, Any] | None, tmp: pathlib.Path) -> list[str]:
    if not values:
        return []
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return ["-f", str(path)]


def template(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = RELEASE_NAMESPACE,
    release: str = RELEASE,
    include_crds: bool = False,
    api_versions: Sequence[str] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`helm template`; `api_versions` are what the cluster would serve (`.Capabilities.APIVersions`), e.g.
    "console.openshift.io/v1" for OpenShift's console."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["template", release, str(CHART), "--namespace", namespace, *_values_args(values, pathlib.Path(tmp))]
        if include_crds:
            args.append("--include-crds")
        args += [f"--api-versions={v}" for v in api_versions]
        return helm(*args, check=check)


def render(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The chart's manifests under `values`, as parsed YAML documents (empty documents dropped)."""
    out = template(values, **kwargs).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def lint(values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        return helm("lint", "--strict", str(CHART), *_values_args(values, pathlib.Path(tmp)), check=False)


def of_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(d) for d in docs if d.get("kind") == kind]


def one(docs: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


# Values sets every chart test renders: the defaults, a namespace list (Roles instead of a ClusterRole), and
# everything optional switched on.
VALUES_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchedNamespaces": ["team-a", "team-b"], "logLevel": "debug"},
    "everything": {
        "image": {"repository": "registry.example.com/arbiter/operator", "digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "pull"}],
        "prometheus": {
            "url": "https://thanos-querier.openshift-monitoring.svc:9091",
            "tenancy": False,  # the web port, with a cluster-monitoring-view token from a Secret
            "tokenSecret": {"name": "prometheus-token", "key": "token"},
            "caConfigMap": {"name": "service-ca", "key": "service-ca.crt"},
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"team": "platform"}}},
        "networkPolicy": {"enabled": True},
        "podAnnotations": {"example.com/owner": "platform"},
        "podLabels": {"cost-center": "ml"},
        "nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/infra", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "extraEnv": [{"name": "ARBITER_EXTRA", "value": "1"}],
        # The console's ConfigMaps go to openshift-config-managed, which only OpenShift has; the Grafana ones to the
        # release namespace.
        "dashboards": {"grafana": {"enabled": True, "labels": {"team": "platform"}}},
    },
}


# ------------------------------------------------------------------ restricted-v2 / PSA restricted

_ALLOWED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# restricted-v2 may add this one capability; PSA restricted too.
_ALLOWED_ADDED_CAPS = {"NET_BIND_SERVICE"}


def restricted_violations(pod_spec: Mapping[str, Any], *, require_read_only_root: bool = True) -> list[str]:
    """Every way `pod_spec` breaks Pod Security "restricted" or OpenShift's restricted-v2 SCC (empty: it passes).

    Beyond PSA, restricted-v2 assigns the UID and fsGroup from the namespace's range: a pod that fixes runAsUser,
    fsGroup or supplementalGroups is refused there unless the numbers happen to fall in that range, so any fixed value
    is a violation here (the image must work under an arbitrary UID instead).
    """
    problems: list[str] = []
    pod_sc = pod_spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(f"pod: {flag} is true")
    for key in ("runAsUser", "fsGroup", "supplementalGroups", "runAsGroup"):
        if pod_sc.get(key) not in (None, []):
            problems.append(f"pod: securityContext.{key} is fixed ({pod_sc[key]}); restricted-v2 assigns it")
    if (pod_sc.get("seLinuxOptions") or {}).get("user") or (pod_sc.get("seLinuxOptions") or {}).get("role"):
        problems.append("pod: seLinuxOptions sets user/role")
    for sysctl in pod_sc.get("sysctls") or []:
        problems.append(f"pod: sysctl {sysctl.get('name')} set")
    for vol in pod_spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= _ALLOWED_VOLUME_TYPES:
            problems.append(f"volume {vol.get('name')}: type {sorted(kinds - _ALLOWED_VOLUME_TYPES)} not allowed")

    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    containers: list[tuple[str, Mapping[str, Any]]] = []
    for field in ("initContainers", "containers", "ephemeralContainers"):
        containers.extend((field, c) for c in pod_spec.get(field) or [])
    if not containers:
        problems.append("pod: no containers")
    for field, c in containers:
        where = f"{field}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}: capabilities.drop must include ALL")
        added = set(caps.get("add") or []) - _ALLOWED_ADDED_CAPS
        if added:
            problems.append(f"{where}: adds capabilities {sorted(added)}")
        non_root = sc.get("runAsNonRoot")
        if not (non_root is True or (non_root is None and pod_non_root)):
            problems.append(f"{where}: runAsNonRoot must be true (pod or container)")
        for key in ("runAsUser", "runAsGroup"):
            if sc.get(key) is not None:
                problems.append(f"{where}: securityContext.{key} is fixed ({sc[key]}); restricted-v2 assigns it")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile must be RuntimeDefault (got {seccomp})")
        if (sc.get("seLinuxOptions") or {}).get("user") or (sc.get("seLinuxOptions") or {}).get("role"):
            problems.append(f"{where}: seLinuxOptions sets user/role")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{where}: procMount {sc['procMount']}")
        if require_read_only_root and field == "containers" and sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem must be true")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
            if int(port.get("containerPort", 1024)) < 1024:
                problems.append(f"{where}: port {port['containerPort']} < 1024 needs a capability the UID lacks")
    return problems


def writable_mounts(container: Mapping[str, Any]) -> list[str]:
    return [m["mountPath"] for m in container.get("volumeMounts") or [] if not m.get("readOnly")]


def pod_from_template(template: Mapping[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """A Pod object built from a Deployment's pod template, for admission tests."""
    meta = dict(template.get("metadata") or {})
    meta.update(name=name, namespace=namespace)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": dict(template["spec"])}


def apply_order(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """CRDs and namespaces first, then RBAC and accounts, then the rest (what helm does on install)."""
    rank = {
        "CustomResourceDefinition": 0,
        "Namespace": 1,
        "ServiceAccount": 2,
        "ClusterRole": 3,
        "Role": 3,
        "ClusterRoleBinding": 4,
        "RoleBinding": 4,
    }
    return sorted((dict(d) for d in docs), key=lambda d: rank.get(d["kind"], 9))
