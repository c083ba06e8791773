"""Promotion overhead: how long the operator takes to act on an analysis, on the real stack.

Runs the real operator against the local cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok's simulated A100 nodes, the real KServe controller) and a real Prometheus (Debian's) scraping workload stand-ins
(the decision server's metrics, as vLLM does not run here) every second, and measures:

  switch:   last passing analysis (operator log) -> Route weights changed (Route watch event)
  rollback: SLA breach visible in Prometheus (this script polls the same p95 query every 100 ms)
            -> Route back to 100% stable (Route watch event); also failing analysis (log) -> Route event

Target: under one second of operator overhead beyond the analysis interval.

    .venv/bin/python benchmarks/promotion_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]  # the support package (e2e_kit, promstack)

from arbiter_devenv import crds  # noqa: E402
from arbiter_devenv.cluster import LocalCluster, wait_default_service_account  # noqa: E402
from arbiter_devenv.s3server import S3Server  # noqa: E402
from arbiter_operator.api.models import isvc_name  # noqa: E402
from arbiter_operator.clients.prometheus import PrometheusClient, PrometheusConfig  # noqa: E402
from arbiter_operator.promotion import build_queries  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from support.e2e_kit import E2E, V1, V2, fast_canary  # noqa: E402
from support.promstack import PromStack  # noqa: E402

INTERVAL = 5
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*analysis of (\S+) step (\d+) \((\w+)\): (\w+):")


class RouteWatch:
    """Timestamps of every change of the Route's weights, as a client watching the apiserver sees them."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, e2e: E2E):
        self.events: list[tuple[float, dict[str, int]]] = []
        self._e2e = e2e
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, args=(api, namespace, name), daemon=True)
        self._t.start()

    def _run(self, api, namespace, name):
        try:
            self._watch(api, namespace, name)
        except Exception:  # the stream ends when the round's namespace is torn down
            pass

    def _watch(self, api, namespace, name):
        objs = client.CustomObjectsApi(api)
        by_service = {f"{isvc_name(self._e2e.name, v)}-predictor": v for v in (V1, V2)}
        for ev in self._w.stream(objs.list_namespaced_custom_object, "route.openshift.io", "v1", namespace, "routes",
                                 field_selector=f"metadata.name={name}"):
            spec = ev["object"]["spec"]
            backends = [spec["to"], *(spec.get("alternateBackends") or [])]
            weights = {by_service[b["name"]]: b.get("weight", 100) for b in backends if b.get("weight", 100) > 0}
            if not self.events or self.events[-1][1] != weights:
                self.events.append((time.time(), weights))

    def first_after(self, t: float, weights: dict[str, int]) -> float | None:
        return next((ts for ts, w in self.events if ts >= t and w == weights), None)

    def stop(self):
        self._w.stop()


def analyses(log: str) -> list[tuple[float, str, int, str, str]]:
    out = []
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if m:
            ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((ts, m.group(2), int(m.group(3)), m.group(4), m.group(5)))
    return out


async def breach_visible(stack: PromStack, ns: str, model: str, version: str, bound_ms: float) -> float:
    q = build_queries(ns, model, version, INTERVAL)["decision_p95"]
    async with PrometheusClient(PrometheusConfig(url=stack.url)) as prom:
        while True:
            samples = await prom.query(q)
            if samples and samples[0][1] * 1000 > bound_ms:
                return time.time()
            await asyncio.sleep(0.1)


def fmt(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"median {statistics.median(xs) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms (n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    cp = LocalCluster().start()
    s3 = S3Server().start()
    stack = PromStack(work).start()
    switch, rollback_total, rollback_after_analysis = [], [], []
    try:
        api = cp.api_client()
        crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=False)
        crds.install_crds(api, crds.arbiter_crd_paths())
        for r in range(args.rounds):
            ns = f"bench-{uuid.uuid4().hex[:6]}"
            core = client.CoreV1Api(api)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            wait_default_service_account(api, ns)
            e = E2E(cp, ns, stack, work, s3)
            e.start_operator()
            try:
                e.create(V1, **fast_canary(rollbackWindowSeconds=0))
                e.wait(lambda e=e: V1 in e.isvcs(), "1.0.0 deployed")
                e.set_state(V1, "ready")
                e.wait(lambda e=e: e.route_weights() == {V1: 100}, "1.0.0 serving")
                routes = RouteWatch(api, ns, e.name, e)

                # Clean canary: 10% -> 50% -> 100%, each switch after a passing final analysis.
                e.patch_promote(version=V2)
                e.wait(lambda e=e: V2 in e.isvcs(), "candidate deployed")
                e.set_state(V2, "ready")
                e.wait(lambda e=e: e.route_weights() == {V2: 100}, "promoted", timeout=120)
                time.sleep(0.5)
                expected = {0: {V1: 50, V2: 50}, 1: {V2: 100}}
                for ts, version, step, kind, verdict in analyses(e.operator_log()):
                    if version == V2 and kind == "final" and verdict == "Pass":
                        t = routes.first_after(ts, expected[step - 1])
                        if t is not None:
                            switch.append(t - ts)

                # Breach: promote 1.0.0 again (stopped: rollbackWindowSeconds=0) and make it slow at step 2.
                e.wait(lambda e=e: set(e.isvcs()) == {V2}, "1.0.0 stopped")
                e.patch_promote(version=V1)
                e.wait(lambda e=e: V1 in e.isvcs(), "candidate deployed")
                e.set_state(V1, "ready")
                e.wait(lambda e=e: e.route_weights() == {V2: 50, V1: 50}, "step 2", timeout=60)
                t0 = time.time()
                e.pods[V1].control(latency_ms=400)
                visible = asyncio.run(breach_visible(stack, ns, e.name, V1, 150.0))
                e.wait(lambda e=e: e.route_weights() == {V2: 100}, "rolled back", timeout=60)
                time.sleep(0.5)
                back = routes.first_after(visible, {V2: 100})
                fail = next((ts for ts, v, _s, _k, verdict in analyses(e.operator_log())
                             if v == V1 and verdict == "Fail" and ts >= t0), None)
                if back is not None:
                    rollback_total.append(back - visible)
                    if fail is not None:
                        rollback_after_analysis.append(back - fail)
                routes.stop()
                print(f"round {r + 1}: switches {[f'{x * 1000:.0f}ms' for x in switch]}, "
                      f"breach->rollback {rollback_total[-1] * 1000 if rollback_total else float('nan'):.0f} ms",
                      flush=True)
            finally:
                e.close()
        api.close()
    finally:
        stack.stop()
        s3.stop()
        cp.stop()

    print()
    print(f"analysis interval: {INTERVAL} s, Prometheus scrape interval: 1 s")
    print(f"last passing analysis -> Route switched:   {fmt(switch)}")
    print(f"failing analysis -> Route back on stable:  {fmt(rollback_after_analysis)}")
    print(f"breach visible in Prometheus -> rollback:  {fmt(rollback_total)}  (bounded by one analysis interval"
          f" + overhead)")
    over = [x - INTERVAL for x in rollback_total]
    print(f"  overhead beyond the analysis interval:   {fmt([max(0.0, x) for x in over])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
