"""Least privilege, measured by the real RBAC authorizer: a kube-apiserver with an audit log, the chart's
ServiceAccount and RBAC installed as `helm template` renders them, and a kubeconfig that authenticates as that
ServiceAccount with a TokenRequest token (the same kind of token a pod gets).

The audit log (level Metadata, ServiceAccount requests only) records every request with its verb, resource,
subresource and the authorizer's decision (`authorization.k8s.io/decision: allow|forbid`). From it:
- `forbidden(events)`: the requests RBAC refused;
- `unused_grants(rules, events)`: the (group, resource, verb) grants no allowed request used.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import yaml
from arbiter_devenv import crds
from arbiter_devenv.cluster import LocalCluster
from kubernetes import client

from support.chartkit import apply_order, render
from support.kubekit import dynamic_client, server_side_apply

# Only ServiceAccounts' requests are recorded: the admin's test set-up would drown the operator's calls.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


@contextmanager
def audited_control_plane(workdir: pathlib.Path) -> Iterator[tuple[LocalCluster, pathlib.Path]]:
    """A LocalCluster (KServe, scheduler, kwok nodes) whose kube-apiserver writes an audit log, with the same CRDs the
    shared fixture installs."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    log = workdir / "audit.log"
    cp = LocalCluster(
        extra_apiserver_args=(
            f"--audit-policy-file={policy}",
            f"--audit-log-path={log}",
            # Every event is written before the response goes out: the log is complete when a call returns.
            "--audit-log-mode=blocking",
            "--audit-log-format=json",
        )
    )
    cp.start()
    try:
        api = cp.api_client()
        try:
            crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=False)
            crds.install_crds(api, crds.arbiter_crd_paths())
        finally:
            api.close()
        yield cp, log
    finally:
        cp.stop()


@dataclasses.dataclass(frozen=True)
class Identity:
    namespace: str
    name: str
    kubeconfig: pathlib.Path
    rules: tuple[tuple[str | None, dict[str, Any]], ...]  # (namespace or None for cluster-wide, rule)

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def install_chart_identity(
    cp: LocalCluster,
    api: client.ApiClient,
    workdir: pathlib.Path,
    *,
    values: Mapping[str, Any] | None = None,
    release_namespace: str = "arbiter-system",
) -> Identity:
    """Apply the chart's ServiceAccount and RBAC (nothing else) and mint a kubeconfig for the ServiceAccount."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release_namespace)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    docs = render(values, namespace=release_namespace)
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    dyn = dynamic_client(api)
    sa_name = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    # The operator's rules are those of the roles bound to its ServiceAccount: not people's (aggregated into admin,
    # edit, view) nor scrapers' (metrics-reader), which the chart renders too.
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace")) for b in docs
             if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name for s in b["subjects"])}
    rules: list[tuple[str | None, dict[str, Any]]] = []
    for doc in apply_order(d for d in docs if d["kind"] in wanted):
        if doc["kind"] == "ServiceAccount":
            doc["metadata"].setdefault("namespace", release_namespace)
        server_side_apply(dyn, doc)
        namespace = doc["metadata"].get("namespace") if doc["kind"] == "Role" else None
        if (doc["kind"], doc["metadata"]["name"], namespace) in bound:
            rules += [(namespace, r) for r in doc["rules"]]
    assert rules, f"no role of the chart is bound to the ServiceAccount {sa_name}"
    token = core.create_namespaced_service_account_token(
        sa_name,
        release_namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)),
    ).status.token
    kubeconfig = cp.write_kubeconfig(workdir / "operator.kubeconfig", token=token, user=sa_name)
    return Identity(release_namespace, sa_name, kubeconfig, tuple(rules))


def read_audit(log: pathlib.Path, username: str) -> list[dict[str, Any]]:
    events = []
    if not log.exists():
        return events
    with log.open() as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            ev = json.loads(line)
            if ev.get("stage") != "ResponseComplete" or ev.get("user", {}).get("username") != username:
                continue
            events.append(ev)
    return events


def _decision(ev: Mapping[str, Any]) -> str:
    return (ev.get("annotations") or {}).get("authorization.k8s.io/decision", "")


def describe(ev: Mapping[str, Any]) -> str:
    ref = ev.get("objectRef") or {}
    res = ref.get("resource", ev.get("requestURI", ""))
    if ref.get("subresource"):
        res += "/" + ref["subresource"]
    group = ref.get("apiGroup") or "core"
    where = f" in {ref['namespace']}" if ref.get("namespace") else ""
    name = f" {ref['name']}" if ref.get("name") else ""
    code = (ev.get("responseStatus") or {}).get("code")
    if code == 403 and _decision(ev) == "allow":
        # The first check passed; the refusal came from a second one (a `patch` that creates needs `create`).
        reason = "the verb was allowed, a second check was refused (an apply that creates also needs `create`)"
    else:
        reason = (ev.get("annotations") or {}).get("authorization.k8s.io/reason", "")
    return f"{ev.get('verb')} {group}/{res}{name}{where} -> {code} {reason}".strip()


def _code(ev: Mapping[str, Any]) -> int:
    return int((ev.get("responseStatus") or {}).get("code") or 0)


def forbidden(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Requests the authorizer refused. A 403 with decision `allow` counts too: the apiserver authorizes some
    requests twice, e.g. a server-side apply (`patch`) that creates the object also needs `create`, and only the
    first decision is annotated."""
    return [describe(ev) for ev in events if _decision(ev) == "forbid" or _code(ev) == 403]


def _verbs(ev: Mapping[str, Any]) -> set[str]:
    """The RBAC verbs an allowed request used: a server-side apply that created its object (201) used `create`."""
    verbs = {ev.get("verb", "")}
    if ev.get("verb") == "patch" and _code(ev) == 201:
        verbs.add("create")
    return verbs


Grant = tuple[str | None, str, str, str]  # (namespace or None, apiGroup, resource[/subresource], verb)


def expand(rules: Sequence[tuple[str | None, Mapping[str, Any]]]) -> set[Grant]:
    out: set[Grant] = set()
    for ns, rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((ns, group, resource, verb))
    return out


def _covers(grant: Grant, ev: Mapping[str, Any]) -> bool:
    ns, group, resource, verb = grant
    ref = ev.get("objectRef") or {}
    if not ref:
        return False
    res = ref.get("resource", "") + (("/" + ref["subresource"]) if ref.get("subresource") else "")
    if (ref.get("apiGroup") or "") != group or res != resource or verb not in _verbs(ev):
        return False
    return ns is None or ref.get("namespace") == ns


def unused_grants(
    rules: Sequence[tuple[str | None, Mapping[str, Any]]], events: Sequence[Mapping[str, Any]]
) -> set[Grant]:
    allowed = [ev for ev in events if _decision(ev) == "allow" and _code(ev) != 403]
    return {g for g in expand(rules) if not any(_covers(g, ev) for ev in allowed)}


def used_grants(events: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource[/sub], verb) of every allowed request: what the operator actually does."""
    out = set()
    for ev in events:
        ref = ev.get("objectRef") or {}
        if _decision(ev) != "allow" or _code(ev) == 403 or not ref:
            continue
        res = ref.get("resource", "") + (("/" + ref["subresource"]) if ref.get("subresource") else "")
        out |= {(ref.get("apiGroup") or "", res, verb) for verb in _verbs(ev)}
    return out
