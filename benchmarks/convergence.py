"""Convergence: create one DecisionModel and time create -> Ready=True (observedGeneration == generation), N times,
against the API floor: the same writes issued directly by a minimal script, with no operator.

    .venv/bin/python benchmarks/convergence.py [--repetitions 50] [--out PATH]

How the floor is built: a warm-up DecisionModel ("template") is converged by the operator first. Its writes are read
from the operator's `kube-write` log lines, grouped by reconcile pass; the bodies are the children the operator
created (read back, server-set fields dropped, renamed), the DecisionModel statuses it wrote (as a watch saw them) and
its Events. The floor then does, per repetition: create the DecisionModel, replay pass 1 (children, status, events),
wait until KServe's controller has marked its InferenceServices Ready (the operator waits for the same thing: the
scheduler places the predictor pod on a simulated A100 node, kwok runs it, the Deployment becomes available), replay the
remaining passes. Both are timed by the same watch on DecisionModels, operator and floor repetitions interleaved so
that load from other processes on the machine hits both alike. Storage is s3:// on the S3 server (SeaweedFS; real
use); the operator's artifact check (S3 reads) is part of its time and not of the floor's.

Target: operator p50 at most 1.2x the floor's.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import fleet
from arbiter_operator.kube.client import RestKubeClient
from arbiter_operator.kube.kinds import KINDS

T = TypeVar("T")

OP_NS, FLOOR_NS = "conv-op", "conv-floor"
TEMPLATE = "cvtemplate"
WRITE = re.compile(r" kube-write (\S+) (\S+) (\S+)/(\S+)(?: \[([^\]]*)\]| (\S+))?")
PASS = re.compile(r" reconciled (\S+)/(\S+): (\d+) writes")
CHILD_API = {
    "ServingRuntime": ("serving.kserve.io", "v1alpha1", "servingruntimes"),
    "InferenceService": ("serving.kserve.io", "v1beta1", "inferenceservices"),
    "Route": ("route.openshift.io", "v1", "routes"),
}


def isvc_ready(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def read_passes(op_log: str) -> list[list[tuple[str, str, str, str]]]:
    """The operator's writes so far as reconcile passes: [(verb, kind, name, extra)]."""
    passes: list[list[tuple[str, str, str, str]]] = []
    current: list[tuple[str, str, str, str]] = []
    for line in op_log.splitlines():
        m = WRITE.search(line)
        if m:
            verb, kind, _ns, name, fields, reason = m.groups()
            current.append((verb, kind, name, fields if fields is not None else (reason or "")))
            continue
        m = PASS.search(line)
        if m and current:
            passes.append(current)
            current = []
    if current:
        passes.append(current)
    return passes


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    keep = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "ownerReferences") if k in meta}
    out = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    out["metadata"] = keep
    if obj.get("kind") == "Service" and isinstance(out.get("spec"), dict):
        # Assigned by the apiserver, not written by the operator: replaying them would claim a taken address.
        out["spec"] = {k: v for k, v in out["spec"].items() if k not in ("clusterIP", "clusterIPs")}
    return out


class Floor:
    """Replays the template's writes for a new DecisionModel in FLOOR_NS (see the module docstring)."""

    def __init__(self, stack: fleet.Stack, dm_watch: fleet.Watcher, isvc_watch: fleet.Watcher):
        self.stack = stack
        self.kube = RestKubeClient(stack.cp.api_client())
        # One loop, in a thread of its own, for the floor's requests (the client is async only): its connections are
        # kept between writes, and the fleet floor's writer threads submit to it at once (a loop a thread would
        # run with run_until_complete is refused by a second thread).
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="floor-loop", daemon=True)
        self._loop_thread.start()
        self.dm_watch = dm_watch
        self.isvc_watch = isvc_watch
        self.passes = read_passes(stack.op.log())
        self.children: dict[tuple[str, str], str] = {}
        for p in self.passes:
            for verb, kind, name, _ in p:
                if verb not in ("apply", "create"):  # a first create is an apply too (create-only)
                    continue
                # Whatever kinds the operator applies (kube/kinds.py KINDS), read back as it wrote them.
                k = next(k for (_av, kn), k in KINDS.items() if kn == kind)
                obj = self._call(self.kube.aget(k.api_version, kind, OP_NS, name))
                assert obj is not None, f"{kind} {OP_NS}/{name} the operator wrote is gone"
                obj.setdefault("apiVersion", k.api_version)
                obj.setdefault("kind", kind)
                self.children[(kind, name)] = json.dumps(strip(obj))
        self.statuses = dm_watch.statuses[(OP_NS, TEMPLATE)]
        self.n_status = sum(1 for p in self.passes for w in p if w[0] == "patch-status")

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self._call(self.kube.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join()
        self.loop.close()

    def describe(self) -> list[list[str]]:
        return [[f"{v} {k} {n}" + (f" [{x}]" if x else "") for v, k, n, x in p] for p in self.passes]

    def run(self, name: str, timeout: float = 120.0) -> float:
        t0 = time.perf_counter()
        self.finish(self.start(name), timeout)
        return self.dm_watch.first[(FLOOR_NS, name)] - t0

    def start(self, name: str, namespace: str = FLOOR_NS) -> dict[str, Any]:
        """Create the DecisionModel and replay the template's first pass; returns what `finish` goes on from."""
        dm = self.stack.custom().create_namespaced_custom_object(common.GROUP, common.VERSION, namespace,
                                                                 common.PLURAL, fleet.example_body(name, namespace))
        state: dict[str, Any] = {"name": name, "namespace": namespace, "dm": dm, "status_i": 0, "isvcs": []}
        if self.passes:
            self._replay(state, self.passes[0])
        return state

    def finish(self, state: dict[str, Any], timeout: float = 120.0) -> None:
        """The template's later passes, each after KServe has marked the InferenceServices Ready (as the operator
        waits), then until the DecisionModel's watch sees it Ready."""
        for p in self.passes[1:]:
            if state["isvcs"] and not self.isvc_watch.wait(state["isvcs"], timeout):
                raise TimeoutError(f"floor: InferenceServices of {state['name']} not Ready")
            self._replay(state, p)
        key = (state["namespace"], state["name"])
        if not self.dm_watch.wait([key], timeout):
            raise TimeoutError(f"floor: {state['name']} not Ready")

    def _replay(self, state: dict[str, Any], writes: list[tuple[str, str, str, str]]) -> None:
        name, namespace, dm = state["name"], state["namespace"], state["dm"]
        rename = lambda s: s.replace(TEMPLATE, name).replace(OP_NS, namespace)  # noqa: E731
        for verb, kind, child, extra in writes:
            if verb in ("apply", "create"):
                body = json.loads(rename(self.children[(kind, child)]))
                for ref in body["metadata"].get("ownerReferences") or []:
                    ref["uid"] = dm["metadata"]["uid"]
                self._call(self.kube.aapply(body))
                if kind == "InferenceService":
                    state["isvcs"].append((namespace, body["metadata"]["name"]))
            elif verb == "patch-status":
                # The k-th status write of the template; the last one is its final (Ready) status.
                snap = self.statuses[len(self.statuses) - self.n_status + state["status_i"]]
                state["status_i"] += 1
                fields = extra.split(",") if extra else list(snap)
                patch = json.loads(rename(json.dumps({f: snap[f] for f in fields if f in snap})))
                self._call(self.kube.apatch_status(
                    f"{common.GROUP}/{common.VERSION}", "DecisionModel", namespace, name, {"status": patch}))
            elif verb == "event":
                self._call(self.kube.aevent(dm, "Normal", extra, extra))


STEPS = (
    "create -> operator's first GET (watch + queue)",
    "pass 1: reads (GET DM, LIST ISVC + ConfigMap, GET ServingRuntime + Route)",
    "pass 1: artifact check (GET Namespace + Secret, S3 client, S3 reads)",
    "pass 1: writes (applies, status, Event)",
    "ISVC Ready by KServe -> pass 2 starts",
    "pass 2: reads",
    "pass 2: artifact check",
    "pass 2: writes (Route, status, Events)",
    "create -> Ready status written",
)


def breakdown(audit_log: Path, names: list[str]) -> dict[str, float]:
    """Median seconds per step of the operator's repetitions, from the apiserver's audit timestamps: where the
    operator's time goes (the S3 part of the artifact check is the gap between its last read and first write)."""
    from datetime import datetime

    def ts(s: str) -> float:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    wanted = set(names)
    per: dict[str, list[tuple[float, float, str, str, str]]] = {}
    with open(audit_log) as fh:
        for line in fh:
            e = json.loads(line)
            ref = e.get("objectRef") or {}
            if e.get("stage") != "ResponseComplete" or not ref.get("name"):
                continue
            owner = next((n for n in wanted if ref["name"] == n or ref["name"].startswith(n + "-")), None)
            if owner is None:
                continue
            res = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            per.setdefault(owner, []).append((ts(e["requestReceivedTimestamp"]), ts(e["stageTimestamp"]),
                                              e["user"]["username"], e["verb"], res))
    rows: list[list[float]] = []
    for es in per.values():
        try:
            es.sort()
            op = [e for e in es if e[2] == common.OPERATOR_USER]
            created = next(e for e in es if e[3] == "create" and e[4] == "decisionmodels")[1]
            route_gets = [e for e in op if e[4] == "routes" and e[3] == "get"]
            w1 = next(e for e in op if e[3] == "patch")[0]
            st1 = next(e for e in op if e[4] == "decisionmodels/status")[1]
            final_op = [e for e in op if e[4] == "decisionmodels/status"][-1][0]
            # KServe writes the InferenceService status several times on the way; the one before the operator's
            # final pass is the Ready one.
            ready = max(e[1] for e in es if e[2] == common.KSERVE_USER and e[4] == "inferenceservices/status"
                        and e[1] < final_op)
            g2 = next(e for e in op if e[4] == "decisionmodels" and e[3] == "get" and e[0] > max(st1, ready))[0]
            rg2 = next(e for e in route_gets if e[0] > g2)[1]
            route = next(e for e in op if e[4] == "routes" and e[3] == "patch")[0]
            final = [e for e in op if e[4] == "decisionmodels/status"][-1][1]
        except (StopIteration, ValueError):
            continue  # a repetition whose requests do not follow the two-pass pattern
        rows.append([op[0][0] - created, route_gets[0][1] - op[0][0], w1 - route_gets[0][1], st1 - w1,
                     g2 - max(st1, ready), rg2 - g2, route - rg2, final - route, final - created])
    if not rows:
        return {}
    return {step: common.statistics.median(r[i] for r in rows) for i, step in enumerate(STEPS)}


def run_operator_once(stack: fleet.Stack, watch: fleet.Watcher, name: str, timeout: float = 120.0) -> float:
    t0 = time.perf_counter()
    stack.custom().create_namespaced_custom_object(common.GROUP, common.VERSION, OP_NS, common.PLURAL,
                                                   fleet.example_body(name, OP_NS))
    if not watch.wait([(OP_NS, name)], timeout):
        raise TimeoutError(f"{name} not Ready after {timeout:.0f}s:\n{stack.op.log()[-3000:]}")
    return watch.first[(OP_NS, name)] - t0


def main(argv: list[str] | None = None) -> int:
    p = common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--repetitions", type=int, default=50)
    p.add_argument("--pause", type=float, default=0.2, help="seconds between repetitions")
    args = p.parse_args(argv)
    result: dict[str, Any] = {"benchmark": "convergence", "machine": common.machine(), "args": vars(args),
                              "storage": "s3:// on SeaweedFS (artifact check reads config.json and the weights' size)"}
    # Every repetition leaves two 1-GPU predictors (operator's and floor's) on the simulated A100 nodes.
    with fleet.Stack([OP_NS], [FLOOR_NS], operator_env=common.parse_env(args.operator_env), keep=args.keep,
                      gpu_nodes=(2 * args.repetitions + 2) // 8 + 2) as stack:
        dm_watch = fleet.Watcher(stack.api, common.GROUP, common.VERSION, common.PLURAL).start()
        isvc_watch = fleet.Watcher(stack.api, *CHILD_API["InferenceService"], pred=isvc_ready).start()
        stack.start_operator()
        warm = run_operator_once(stack, dm_watch, TEMPLATE)
        time.sleep(1.0)  # let the template's last pass log its line
        common.log(f"template converged in {warm:.2f}s (first one: imports, connections)")
        floor = Floor(stack, dm_watch, isvc_watch)
        result["floor_writes"] = floor.describe()
        common.log("floor replays: " + " | ".join("; ".join(p) for p in floor.describe()))
        floor.run("flwarm")  # warm the floor's connections too
        op_times, floor_times = [], []
        for i in range(args.repetitions):
            op_times.append(run_operator_once(stack, dm_watch, f"cv-{i:04d}"))
            time.sleep(args.pause)
            floor_times.append(floor.run(f"fl-{i:04d}"))
            time.sleep(args.pause)
            if (i + 1) % 10 == 0:
                common.log(f"  {i + 1}/{args.repetitions}: operator p50 {common.percentile(op_times, 50):.3f}s, "
                           f"floor p50 {common.percentile(floor_times, 50):.3f}s")
        floor.close()
        op_writes = stack.op.writes()
        dm_watch.stop()
        isvc_watch.stop()
        stack.flush_audit()
        steps = breakdown(stack.audit_log, [f"cv-{i:04d}" for i in range(args.repetitions)])
    op_s, fl_s = common.summary(op_times), common.summary(floor_times)
    ratio = {k: op_s[k] / fl_s[k] for k in ("p50", "p95", "p99")}
    result.update({"operator_seconds": op_s, "floor_seconds": fl_s, "ratio": ratio,
                   "operator_samples": op_times, "floor_samples": floor_times,
                   "operator_writes_total": len(op_writes), "operator_steps_median_seconds": steps})
    print(f"\n## Convergence: create -> Ready, {args.repetitions} repetitions (seconds)\n")
    print(common.table(["", "p50", "p95", "p99", "mean", "min", "max"], [
        ("operator", *(op_s[k] for k in ("p50", "p95", "p99", "mean", "min", "max"))),
        ("API floor", *(fl_s[k] for k in ("p50", "p95", "p99", "mean", "min", "max"))),
        ("ratio operator/floor", ratio["p50"], ratio["p95"], ratio["p99"], "", "", ""),
    ]))
    if steps:
        print("\nWhere the operator's time goes (median seconds, apiserver audit timestamps):\n")
        print(common.table(["step", "seconds"], steps.items()))
    print(f"\nTarget: p50 ratio <= 1.2 -> {'met' if ratio['p50'] <= 1.2 else 'NOT met'}")
    common.write_json(result, args.out, "convergence.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
