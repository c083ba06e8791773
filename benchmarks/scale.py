"""Scale: N DecisionModels (default 1,000) across 20 namespaces, created at once; time until all are Ready, the
operator's peak RSS and CPU seconds, and the API requests it made per DecisionModel, by verb and resource.

    .venv/bin/python benchmarks/scale.py [--count 1000] [--namespaces 20] [--web-identity] [--out PATH]

Targets: all Ready in under 60 s on the 2-core machine, operator under 300 MB RSS.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import fleet
import profiler


def run_scale(stack: fleet.Stack, count: int, namespaces: list[str], timeout: float, threads: int = 8,
              profile: bool = False, profile_gil: bool = False, profile_rate: int = 50,
              own_models: bool = False) -> dict:
    """Create `count` DecisionModels spread over `namespaces` and wait until all are Ready (operator running).
    own_models: each serves a model of its own (its own S3 prefix), else all serve the example's."""
    custom = stack.custom()
    keys = [(namespaces[i % len(namespaces)], f"dm-{i:04d}") for i in range(count)]
    if own_models:
        assert stack.s3 is not None
        t = time.monotonic()
        fleet.seed_own_models(stack.s3, [name for _, name in keys], threads)
        common.log(f"a model of its own for each DecisionModel on S3 in {time.monotonic() - t:.1f}s")
    watcher = fleet.Watcher(stack.api, common.GROUP, common.VERSION, common.PLURAL).start()
    # The operator's share of the wall time: when it had made every InferenceService, and how long after KServe
    # marked one Ready its DecisionModel was Ready (the rest is KServe, the controller-manager, scheduler and kwok).
    isvc_made = fleet.Watcher(stack.api, "serving.kserve.io", "v1beta1", "inferenceservices",
                               pred=lambda _obj: True).start()
    isvc_ready = fleet.Watcher(stack.api, "serving.kserve.io", "v1beta1", "inferenceservices").start()
    stats = stack.stats()
    cpu0, sys0 = stats.cpu_seconds(), stats.system_cpu_seconds()
    metrics0 = common.metrics_requests(stack.api)
    own0 = common.operator_counters(stack.op)
    wall0 = time.time()
    t0 = time.perf_counter()

    peak = [stats.rss()]
    done = threading.Event()

    def sample() -> None:  # VmHWM is the exact peak; the samples show the curve
        while not done.wait(0.5):
            peak.append(stats.rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    prof = (profiler.Profiler(stats.pid, stack.workdir / "profile.txt", rate=profile_rate, gil=profile_gil)
            if profile else None)
    create_s = fleet.create_many(custom, keys, threads, own_models)
    common.log(f"{count} DecisionModels created in {create_s:.1f}s; waiting for Ready")
    last_report = time.monotonic()
    deadline = time.monotonic() + timeout
    ok = False
    while time.monotonic() < deadline:
        if watcher.wait(keys, 5.0):
            ok = True
            break
        if time.monotonic() - last_report > 15:
            common.log(f"  {watcher.count()}/{count} Ready after {time.perf_counter() - t0:.0f}s, "
                       f"operator RSS {stats.rss() / 2**20:.0f} MiB, CPU {stats.cpu_seconds() - cpu0:.1f}s")
            last_report = time.monotonic()
    ready_times = sorted(watcher.first[k] - t0 for k in keys if k in watcher.first)
    all_ready_s = ready_times[-1] if ok else float("nan")
    cpu_s = stats.cpu_seconds() - cpu0
    sys_s = stats.system_cpu_seconds() - sys0
    wall1 = time.time()
    done.set()
    for w in (watcher, isvc_made, isvc_ready):
        w.stop()
    made = sorted(t - t0 for t in isvc_made.first.values())
    lags = [watcher.first[k] - t for (ns, isvc), t in isvc_ready.first.items()
            for k in [(ns, isvc.split("--")[0])] if k in watcher.first]
    lags.sort()
    if prof is not None:
        prof.stop()
        if prof.path.exists():  # the collapsed stacks, for flame graphs (the work directory goes with the stack)
            common.RESULTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(prof.path, common.RESULTS / "scale-profile.txt")
    metrics1 = common.metrics_requests(stack.api)
    own1 = common.operator_counters(stack.op)
    own = {k: v - own0.get(k, 0.0) for k, v in own1.items()}
    stack.flush_audit()
    op_req = common.audit_requests(stack.audit_log, common.OPERATOR_USER, wall0, wall1)
    kserve_req = common.audit_requests(stack.audit_log, common.KSERVE_USER, wall0, wall1)
    all_req = common.audit_requests(stack.audit_log, None, wall0, wall1)
    metrics_diff = metrics1 - metrics0
    return {
        "count": count,
        "namespaces": len(namespaces),
        "all_ready": ok,
        "ready_count": len(ready_times),
        "create_seconds": create_s,
        "all_ready_seconds": all_ready_s,
        "ready_seconds_p50": common.percentile(ready_times, 50),
        "ready_seconds_p95": common.percentile(ready_times, 95),
        "isvcs_created": len(made),
        "all_isvcs_created_seconds": made[-1] if made else float("nan"),
        "ready_after_isvc_ready_p50": common.percentile(lags, 50) if lags else float("nan"),
        "ready_after_isvc_ready_p95": common.percentile(lags, 95) if lags else float("nan"),
        "ready_after_isvc_ready_max": lags[-1] if lags else float("nan"),
        "operator_cpu_seconds": cpu_s,
        "operator_system_cpu_seconds": sys_s,
        "operator_peak_rss_bytes": stats.peak_rss(),
        "operator_rss_end_bytes": stats.rss(),
        "operator_requests": common.counter_json(op_req),
        "operator_requests_total": sum(op_req.values()),
        "operator_requests_per_dm": sum(op_req.values()) / count,
        "operator_requests_per_dm_excluding_watch": sum(n for (v, _), n in op_req.items() if v != "watch") / count,
        "kserve_requests_total": sum(kserve_req.values()),
        "audit_requests_total_all_clients": sum(all_req.values()),
        "metrics_requests_total_all_clients": sum(metrics_diff.values()),
        "metrics_requests_all_clients": common.counter_json(metrics_diff),
        "operator_reconciles_per_dm": own.get("reconciles", 0.0) / count,
        "operator_echoes_skipped_per_dm": own.get("echoes_skipped", 0.0) / count,
        "operator_own_requests_per_dm": sum(v for k, v in own.items() if k.startswith("requests_")) / count,
        "operator_watch_events_per_dm": {k[len("watch_events_"):]: v / count for k, v in sorted(own.items())
                                         if k.startswith("watch_events_")},
        "operator_watch_kib_per_dm": {k[len("watch_bytes_"):]: v / count / 1024 for k, v in sorted(own.items())
                                      if k.startswith("watch_bytes_")},
        "_op_counter": op_req,
        "profile_top": prof.top(40) if prof is not None else [],
        "profile_self": prof.top_self(30) if prof is not None else [],
        "profile_busy_percent": prof.busy_share() if prof is not None else 0.0,
    }


def print_scale(r: dict) -> None:
    mib = 2**20
    shards = f", {r['shards']} operator shards" if r.get("shards") else ""
    print(f"\n## Scale: {r['count']} DecisionModels in {r['namespaces']} namespaces{shards}\n")
    print(common.table(["measure", "value", "target"], [
        ("all Ready (s)", r["all_ready_seconds"], "< 30 (1,000)"),
        ("created in (s)", r["create_seconds"], ""),
        ("Ready p50 / p95 (s)", f"{r['ready_seconds_p50']:.1f} / {r['ready_seconds_p95']:.1f}", ""),
        ("operator's share: every InferenceService made (s)",
         f"{r['all_isvcs_created_seconds']:.1f} ({r['isvcs_created']} made)", ""),
        ("operator's share: DecisionModel Ready after KServe's Ready, p50 / p95 / max (s)",
         f"{r['ready_after_isvc_ready_p50']:.2f} / {r['ready_after_isvc_ready_p95']:.2f} / "
         f"{r['ready_after_isvc_ready_max']:.2f}", ""),
        ("operator peak RSS (MiB)", r["operator_peak_rss_bytes"] / mib, "< 200"),
        ("operator CPU (s): all / in the kernel", f"{r['operator_cpu_seconds']:.2f} / "
         f"{r['operator_system_cpu_seconds']:.2f}", ""),
        ("operator CPU per DM (ms)", 1000 * r["operator_cpu_seconds"] / r["count"], "< 15"),
        ("operator API requests per DM (audit)", r["operator_requests_per_dm"], "<= 10"),
        ("operator API requests per DM (its own metric)", r["operator_own_requests_per_dm"], ""),
        ("reconcile passes per DM / watch echoes skipped per DM",
         f"{r['operator_reconciles_per_dm']:.2f} / {r['operator_echoes_skipped_per_dm']:.2f}", ""),
        ("apiserver_request_total diff, all clients", r["metrics_requests_total_all_clients"], ""),
        ("audit: all clients / KServe controller",
         f"{r['audit_requests_total_all_clients']} / {r['kserve_requests_total']}",
         ""),
    ]))
    if r["operator_watch_events_per_dm"]:
        print("\nEvents on the operator's watches of its children, per DecisionModel:\n")
        print(common.table(["kind", "events", "KiB"], [
            (kind, f"{n:.2f}", f"{r['operator_watch_kib_per_dm'].get(kind, 0.0):.1f}")
            for kind, n in r["operator_watch_events_per_dm"].items()]))
    if r.get("profile_top"):
        print(f"\nOperator CPU profile (py-spy; {r['profile_busy_percent']:.0f}% of the samples were busy, the rest "
              "waited): inclusive % of the busy samples\n")
        print(common.table(["function", "%"], r["profile_top"]))
        print("\nself % of the busy samples (the innermost frame)\n")
        print(common.table(["function", "%"], r["profile_self"]))
    print(f"\nOperator requests by verb and resource (audit log, user {common.OPERATOR_USER}):\n")
    print(common.table(["verb", "resource", "requests", "per DM"], common.counter_rows(r["_op_counter"], r["count"])))


def main(argv: list[str] | None = None) -> int:
    p = common.add_watch_arg(common.base_parser(__doc__.split("\n\n")[0]))
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--namespaces", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for all Ready")
    p.add_argument("--profile", action="store_true", help="py-spy the operator while it converges")
    p.add_argument("--gil", action="store_true",
                   help="with --profile: sample only the thread holding the GIL (where Python's CPU goes)")
    p.add_argument("--profile-rate", type=int, default=50, help="with --profile: samples per second")
    p.add_argument("--threads", type=int, default=8, help="concurrent creating clients")
    p.add_argument("--model-per-dm", action="store_true",
                   help="each DecisionModel serves a model of its own (its own S3 prefix): no two share an artifact "
                        "check; by default all serve the example's model")
    p.add_argument("--web-identity", action="store_true",
                   help="the operator reads S3 with its own web identity (a ServiceAccount token exchanged at the S3 "
                        "server's STS); the storage-config entries hold no keys")
    p.add_argument("--shards", type=int, default=0,
                   help="run this many operators, each owning the namespaces labelled with its number "
                        "(--namespace-selector); CPU adds up, RSS is the largest shard's")
    args = p.parse_args(argv)
    nss = [f"scale-{i:02d}" for i in range(args.namespaces)]
    result = {"benchmark": "scale", "machine": common.machine(), "args": vars(args)}
    # One 1-GPU predictor per DecisionModel, eight per simulated A100 node, and a spare node.
    with fleet.Stack(nss, operator_env=common.parse_env(args.operator_env), keep=args.keep,
                      gpu_nodes=args.count // 8 + 2, shards=args.shards, watch=args.watch,
                      web_identity=args.web_identity) as stack:
        stack.start_operator()
        r = run_scale(stack, args.count, nss, args.timeout, args.threads, args.profile, args.gil, args.profile_rate,
                      args.model_per_dm)
        r["shards"] = args.shards
    print_scale(r)
    r.pop("_op_counter")
    result.update(r)
    common.write_json(result, args.out, "scale.json")
    return 0 if r["all_ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
