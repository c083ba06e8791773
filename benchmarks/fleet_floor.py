"""The platform's floor for a fleet: N DecisionModels across 20 namespaces brought to Ready with no operator at all,
by replaying the operator's own writes for each of them, to set the scale benchmark's "all Ready" beside what
KServe's controller, the controller-manager, the scheduler and kwok need for the same predictors on the same machine.

    .venv/bin/python benchmarks/fleet_floor.py [--count 1000] [--namespaces 20] [--writers 16]

The floor is the convergence benchmark's (convergence.Floor): the operator converges one template DecisionModel, its
writes are read back, and the operator is stopped. Then, for every DecisionModel: create it and replay the template's
first pass (children, status, Event) with `--writers` clients at a time (the operator's 16 workers); as soon as
KServe marks its InferenceService Ready, replay the later passes (the Ready status). Timed by the same kind of watch
as benchmarks/scale.py: the DecisionModel's Ready condition. Nothing here computes what to write; what it measures is
the apiserver and the controllers behind it, so no operator can make the same fleet Ready faster on this machine.

It also prints KServe's own requests from the audit log. KServe's controller reads its ConfigMaps
(inferenceservice-config and the like) with an uncached clientset several times per reconcile, and that clientset
is rate-limited on the client side at 20 requests per second (controller-runtime v0.19's default, which KServe
pins); the ConfigMap reads divided by 20 are a bound below which no fleet can become Ready with that controller,
however many cores the machine has.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import fleet
from convergence import CHILD_API, OP_NS, TEMPLATE, Floor, isvc_ready, run_operator_once

# KServe's clientset: controller-runtime v0.19's GetConfig gives it QPS 20 (burst 30); KServe sets none of its own.
KSERVE_CLIENT_QPS = 20.0


def main(argv: list[str] | None = None) -> int:
    p = common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--namespaces", type=int, default=20)
    p.add_argument("--writers", type=int, default=16, help="clients replaying first passes at once")
    p.add_argument("--timeout", type=float, default=1500.0, help="seconds to wait for all Ready")
    args = p.parse_args(argv)
    nss = [f"floor-{i:02d}" for i in range(args.namespaces)]
    keys = [(nss[i % len(nss)], f"dm-{i:04d}") for i in range(args.count)]
    result: dict = {"benchmark": "fleet-floor", "machine": common.machine(), "args": vars(args)}
    with fleet.Stack([OP_NS], nss, operator_env=common.parse_env(args.operator_env), keep=args.keep,
                      gpu_nodes=args.count // 8 + 2) as stack:
        dm_watch = fleet.Watcher(stack.api, common.GROUP, common.VERSION, common.PLURAL).start()
        isvc_watch = fleet.Watcher(stack.api, *CHILD_API["InferenceService"], pred=isvc_ready).start()
        stack.start_operator()
        warm = run_operator_once(stack, dm_watch, TEMPLATE)
        time.sleep(1.0)  # the template's last pass logs its line
        floor = Floor(stack, dm_watch, isvc_watch)
        stack.op.stop()  # from here on nothing but the replay writes
        common.log(f"template converged in {warm:.2f}s; operator stopped; replaying "
                   + " | ".join("; ".join(p) for p in floor.describe()))
        writers = threading.Semaphore(args.writers)
        t0 = time.perf_counter()
        wall0 = time.time()
        errors: list[str] = []

        def one(key: tuple[str, str]) -> None:
            try:
                with writers:
                    state = floor.start(key[1], key[0])
                floor.finish(state, timeout=args.timeout)
            except Exception as exc:  # reported, and the run counts as not all Ready
                errors.append(f"{key}: {exc}")

        # One thread per DecisionModel: most of them wait for KServe; the semaphore bounds the writers.
        with ThreadPoolExecutor(max_workers=args.count) as pool:
            done = pool.map(one, keys)
            while True:
                finished = dm_watch.wait([k for k in keys], 15.0)
                common.log(f"  {sum(1 for k in keys if k in dm_watch.first)}/{args.count} Ready after "
                           f"{time.perf_counter() - t0:.0f}s")
                if finished or time.perf_counter() - t0 > args.timeout or errors:
                    break
            list(done)
        floor.close()
        ready = sorted(dm_watch.first[k] - t0 for k in keys if k in dm_watch.first)
        made = sorted(t - t0 for (ns, _), t in isvc_watch.first.items() if ns in nss)
        dm_watch.stop()
        isvc_watch.stop()
        stack.flush_audit()
        kserve = common.audit_requests(stack.audit_log, common.KSERVE_USER, wall0)
    all_ready = len(ready) == args.count
    result.update({
        "all_ready": all_ready, "errors": errors[:20],
        "all_ready_seconds": ready[-1] if all_ready else float("nan"),
        "ready_seconds_p50": common.percentile(ready, 50), "ready_seconds_p95": common.percentile(ready, 95),
        "isvc_ready_last_seconds": made[-1] if made else float("nan"),
        "kserve_requests": common.counter_json(kserve),
        "kserve_configmap_gets": kserve[("get", "configmaps")],
        "kserve_configmap_gets_per_model": kserve[("get", "configmaps")] / args.count,
        "kserve_configmap_bound_seconds": kserve[("get", "configmaps")] / KSERVE_CLIENT_QPS,
    })
    print(f"\n## Fleet floor: {args.count} DecisionModels in {args.namespaces} namespaces, no operator\n")
    print(common.table(["measure", "value"], [
        ("all Ready (s)", result["all_ready_seconds"]),
        ("Ready p50 / p95 (s)", f"{result['ready_seconds_p50']:.1f} / {result['ready_seconds_p95']:.1f}"),
        ("last InferenceService Ready by KServe (s)", result["isvc_ready_last_seconds"]),
        ("errors", len(errors)),
        ("KServe's requests, all", sum(kserve.values())),
        ("KServe's ConfigMap GETs (per DecisionModel)",
         f"{result['kserve_configmap_gets']} ({result['kserve_configmap_gets_per_model']:.1f})"),
        (f"their bound at KServe's {KSERVE_CLIENT_QPS:.0f}/s client limit (s)",
         result["kserve_configmap_bound_seconds"]),
    ]))
    print("\nKServe's requests:\n")
    print(common.table(["verb", "resource", "count", "per DecisionModel"],
                       common.counter_rows(kserve, per=args.count)[:12]))
    common.write_json(result, args.out, "fleet-floor.json")
    return 0 if all_ready else 1


if __name__ == "__main__":
    sys.exit(main())
