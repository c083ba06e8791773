"""The fleet an operator benchmark drives (convergence.py, scale.py, idle.py, ...): its `Stack`, a `Watcher` per kind,
the DecisionModels it creates.

`Stack` starts what a benchmark needs, all real:

- the devenv LocalCluster (etcd, kube-apiserver with an audit log, kube-controller-manager, kube-scheduler, kwok's
  simulated A100 nodes and pod lifecycles, the real KServe controller with its webhooks), each component under a
  client certificate of its own, so every request is attributed to the identity that made it; upstream CRDs
  (KServe's, Route, ModelRegistry) and Arbiter's CRD;
- the S3 server (SeaweedFS) with the example model's files (config.json + weights), and a KServe `storage-config`
  Secret in each namespace: the operator checks artifacts on S3 as it does in real use (an s3:// storageUri, not
  pvc://, whose check is skipped as not checkable);
- the operator as a separate process (`python -m arbiter_operator`, OperatorProcess) under its own ServiceAccount
  token, so its API requests can be told apart from the driver's, KServe's and the cluster's.

Request counts come from two places: the apiserver's `apiserver_request_total` (from /metrics, every client together)
and the audit log (per user). The operator's figures are the audit log's, filtered by its ServiceAccount; the
metrics totals are printed next to them as a cross-check (metrics total = operator + KServe + cluster components +
driver).
"""
from __future__ import annotations

import copy
import json
import pathlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import yaml
from arbiter_devenv import crds
from arbiter_devenv.cluster import LocalCluster, NodePool
from arbiter_devenv.kwok import A100
from arbiter_devenv.local import _seed_example_storage, _storage_config_secret
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_devenv.s3server import S3Server
from common import (
    AUDIT_FLUSH_S,
    AUDIT_POLICY,
    EXAMPLE,
    GROUP,
    OPERATOR_SA,
    PLURAL,
    SHARD_LABEL,
    SYSTEM_NS,
    VERSION,
    GroupStats,
    ProcStats,
    log,
)
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch


class Shards:
    """Several operator processes, one per shard, read as one: their metrics pages, logs and writes concatenated."""

    def __init__(self, ops: list[OperatorProcess]):
        self.ops = ops
        self.proc = ops[0].proc
        self.log_path = ops[0].log_path

    def scrape(self) -> str:
        return "\n".join(op.scrape() for op in self.ops)

    def log(self) -> str:
        return "\n".join(op.log() for op in self.ops)

    def writes(self) -> list[str]:
        return [w for op in self.ops for w in op.writes()]

    def stop(self) -> None:
        for op in self.ops:
            op.stop()


def example_body(name: str, namespace: str) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    return body


def is_ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return status.get("observedGeneration") == obj["metadata"].get("generation") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


class Watcher:
    """Watches one kind (all namespaces) and timestamps, per (namespace, name), the first event that satisfies
    `pred`; also keeps every status seen in order (the convergence floor replays them). The clock is
    time.perf_counter, taken when the event arrives here: the same observer for the operator and the floor."""

    def __init__(self, api: k8s.ApiClient, group: str, version: str, plural: str,
                 pred: Callable[[dict[str, Any]], bool] = is_ready):
        self.custom = k8s.CustomObjectsApi(api)
        self.args = (group, version, plural)
        self.pred = pred
        self.first: dict[tuple[str, str], float] = {}
        self.statuses: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._w: k8s_watch.Watch | None = None
        self._started = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"watch-{plural}")

    def start(self) -> Watcher:
        self._t.start()
        self._started.wait(30)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.custom.list_cluster_custom_object(*self.args)
                for item in listing["items"]:
                    self._seen(item)
                self._started.set()
                self._w = k8s_watch.Watch()
                for ev in self._w.stream(self.custom.list_cluster_custom_object, *self.args,
                                         resource_version=listing["metadata"]["resourceVersion"],
                                         timeout_seconds=3600):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._seen(ev["object"])
            except Exception as exc:  # a restart of the watch; the listing catches up
                if not self._stop.is_set():
                    log(f"watch restarts: {exc}")
                    time.sleep(0.2)

    def _seen(self, obj: dict[str, Any]) -> None:
        now = time.perf_counter()
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._cond:
            st = obj.get("status")
            seen = self.statuses.setdefault(key, [])
            if st and (not seen or seen[-1] != st):
                seen.append(copy.deepcopy(st))
            if key not in self.first and self.pred(obj):
                self.first[key] = now
                self._cond.notify_all()

    def wait(self, keys: Iterable[tuple[str, str]], timeout: float) -> bool:
        keys = list(keys)
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(k in self.first for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def count(self) -> int:
        with self._cond:
            return len(self.first)

    def stop(self) -> None:
        self._stop.set()
        if self._w is not None:
            self._w.stop()


# -- the stack --------------------------------------------------------------------------------------------------------


class Stack:
    """Local cluster (with audit log, KServe, scheduler, kwok nodes) + CRDs + S3 server + operator; see the module
    docstring.

    `operator_namespaces` are watched by the operator; `extra_namespaces` only get the storage Secret and the
    KServe (the convergence floor writes there with no operator watching)."""

    def __init__(self, operator_namespaces: list[str], extra_namespaces: list[str] = (), *,
                 operator_env: dict[str, str] | None = None, keep: bool = False, gpu_nodes: int = 4, shards: int = 0,
                 watch: str = "listed", web_identity: bool = False):
        self.op_namespaces = list(operator_namespaces)
        # "listed": the operator is given its namespaces (--namespace each); "all": it watches cluster-wide (the
        # chart's default), which also sees the extra namespaces' objects.
        self.watch = watch
        # shards > 0: that many operators, each owning the namespaces labelled with its number (--namespace-selector)
        self.shards = shards
        self.namespaces = self.op_namespaces + list(extra_namespaces)
        self.operator_env = dict(operator_env or {})
        # True: the operator reads S3 with its own web identity, the storage-config entries hold no keys
        self.web_identity = web_identity
        self.keep = keep
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
        self.audit_log = self.workdir / "audit.log"
        # One 8-GPU A100 node holds 8 one-GPU predictors: size the pool to the number of versions a run deploys.
        self.gpu_nodes = gpu_nodes
        self.cp: LocalCluster | None = None
        self.s3: S3Server | None = None
        self.op: OperatorProcess | Shards | None = None
        self.api: k8s.ApiClient | None = None

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(json.dumps(AUDIT_POLICY))
        t = time.monotonic()
        pools = (NodePool("a100", self.gpu_nodes, gpus=8, gpu_product=A100, cpu="128", memory="1Ti"),
                 NodePool("cpu", 2, cpu="32", memory="128Gi"))
        self.cp = LocalCluster(pools=pools, extra_apiserver_args=(
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=batch",
            f"--audit-log-batch-max-wait={AUDIT_FLUSH_S:.0f}s",
            "--audit-log-maxsize=0",  # no rotation: the counts read one file
        )).start()
        self.api = self.cp.api_client()
        crds.install_crds(self.api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=False)
        crds.install_crds(self.api, crds.arbiter_crd_paths())
        log(f"cluster (KServe, scheduler, {self.gpu_nodes} A100 nodes) + CRDs in {time.monotonic() - t:.1f}s "
            f"({self.cp.server}; {', '.join(f'{k} {v:.1f}s' for k, v in self.cp.timings.items())})")

        core = k8s.CoreV1Api(self.api)
        rbac = k8s.RbacAuthorizationV1Api(self.api)
        core.create_namespace({"metadata": {"name": SYSTEM_NS}})
        tokens = {}
        for sa in (OPERATOR_SA,):
            core.create_namespaced_service_account(SYSTEM_NS, {"metadata": {"name": sa}})
            # cluster-admin keeps RBAC out of the measurement; the chart's Roles are tested in tests/cluster/security.
            rbac.create_cluster_role_binding({
                "metadata": {"name": f"bench-{sa}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": SYSTEM_NS}],
            })
            tr = core.create_namespaced_service_account_token(
                sa, SYSTEM_NS, {"spec": {"expirationSeconds": 86400}})
            tokens[sa] = tr.status.token
        self.operator_kubeconfig = self.cp.write_kubeconfig(self.workdir / "operator.kubeconfig",
                                                            token=tokens[OPERATOR_SA], user=OPERATOR_SA)

        t = time.monotonic()
        if self.web_identity:
            import web_identity

            self.s3, env = web_identity.start_s3(self.cp, SYSTEM_NS, OPERATOR_SA, self.workdir)
            self.operator_env.update(env)
            secret = web_identity.keyless_storage_config(self.s3)
        else:
            self.s3 = S3Server().start()
            secret = _storage_config_secret(self.s3)
        _seed_example_storage(self.s3, yaml.safe_load(EXAMPLE.read_text()))
        for i, ns in enumerate(self.namespaces):
            labels = {SHARD_LABEL: str(i % self.shards)} if self.shards and ns in self.op_namespaces else {}
            core.create_namespace({"metadata": {"name": ns, "labels": labels}})
            core.create_namespaced_secret(ns, secret)
        log(f"S3 server + {len(self.namespaces)} namespaces in {time.monotonic() - t:.1f}s")
        return self

    def start_operator(self) -> OperatorProcess | Shards:
        t = time.monotonic()
        if self.shards:
            self.op = Shards([
                OperatorProcess(self.operator_kubeconfig, [], env=self.operator_env,
                                extra_args=("--namespace-selector", f"{SHARD_LABEL}={i}"),
                                log_dir=self.workdir / f"operator-{i}", metrics=True).start(timeout=120)
                for i in range(self.shards)])
            log(f"{self.shards} operator shards live in {time.monotonic() - t:.1f}s")
            return self.op
        watched = self.op_namespaces if self.watch == "listed" else []
        self.op = OperatorProcess(self.operator_kubeconfig, watched, env=self.operator_env,
                                  log_dir=self.workdir / "operator", metrics=True).start(timeout=120)
        log(f"operator live in {time.monotonic() - t:.1f}s (pid {self.op.proc.pid}, log {self.op.log_path})")
        return self.op

    def stats(self) -> ProcStats | GroupStats:
        assert self.op is not None and self.op.proc is not None
        if isinstance(self.op, Shards):
            return GroupStats([op.proc.pid for op in self.op.ops if op.proc is not None])
        return ProcStats(self.op.proc.pid)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def flush_audit(self) -> None:
        time.sleep(AUDIT_FLUSH_S + 1.0)

    def stop(self) -> None:
        for part in (self.op, self.s3, self.cp):
            if part is None:
                continue
            try:
                part.stop()
            except Exception as exc:
                log(f"stopping {type(part).__name__}: {exc}")
        if self.keep:
            log(f"work directory kept: {self.workdir}")
        else:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


def own_model_uri(storage_uri: str, name: str) -> str:
    """The storageUri of a DecisionModel that serves a model of its own: the example's, suffixed with its name."""
    return f"{storage_uri.rstrip('/')}-{name}"


def seed_own_models(s3: S3Server, names: Iterable[str], threads: int = 8) -> None:
    """A copy of the example model's files under each name's own prefix (own_model_uri)."""
    from concurrent.futures import ThreadPoolExecutor

    client = s3.client()
    uris = [v["storageUri"] for v in yaml.safe_load(EXAMPLE.read_text())["spec"]["versions"]]

    def one(name: str) -> None:
        for uri in uris:
            bucket, _, prefix = own_model_uri(uri, name).removeprefix("s3://").partition("/")
            for key in ("config.json", "model.safetensors"):
                source = f"{uri.removeprefix('s3://').partition('/')[2]}/{key}"
                client.copy_object(Bucket=bucket, Key=f"{prefix}/{key}", CopySource={"Bucket": bucket, "Key": source})

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


def create_many(custom: k8s.CustomObjectsApi, keys: list[tuple[str, str]], threads: int = 8,
                own_models: bool = False) -> float:
    """Create one example DecisionModel per (namespace, name), `threads` at a time; returns seconds taken.
    own_models: each serves a model of its own (own_model_uri, seeded by seed_own_models), so no two DecisionModels
    read the same artifacts; else all serve the example's."""
    from concurrent.futures import ThreadPoolExecutor

    def one(key: tuple[str, str]) -> None:
        ns, name = key
        body = example_body(name, ns)
        if own_models:
            for version in body["spec"]["versions"]:
                version["storageUri"] = own_model_uri(version["storageUri"], name)
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    t = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, keys))
    return time.monotonic() - t
