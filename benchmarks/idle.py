"""Idle cost: with N Ready DecisionModels (default 1,000 in 20 namespaces) and nothing changing, the operator's API
requests per minute (watch streams aside: they are listed separately) and its CPU, over a window (default 5 min).

    .venv/bin/python benchmarks/idle.py [--count 1000] [--seconds 300] [--settle 10] [--out PATH]

The DecisionModels are created and converged first (the scale benchmark's set-up, reported too); the window starts
once, after the last one is Ready, the operator has made no request (watches aside) for `--settle` seconds: passes
that its own last writes triggered are still work, not idle cost (the time it took is reported as settle_seconds).
Target: zero requests when nothing changes.

Note the operator's periodic resync (app.RESYNC_ENV, 600 s by default, counted from each DecisionModel's
last reconcile): a window shorter than that after convergence cannot see it. `--operator-env
ARBITER_RESYNC_SECONDS=120` shows what one resync round costs within a 5-minute window.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import fleet
import scale
from scale import run_scale


def main(argv: list[str] | None = None) -> int:
    p = common.add_watch_arg(common.base_parser(__doc__.split("\n\n")[0]))
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--namespaces", type=int, default=20)
    p.add_argument("--seconds", type=float, default=300.0, help="length of the idle window")
    p.add_argument("--settle", type=float, default=10.0,
                   help="the window starts once the operator has made no request (watches aside) for this long")
    p.add_argument("--settle-max", type=float, default=600.0, help="give up waiting for quiet after this long")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--model-per-dm", action="store_true",
                   help="each DecisionModel serves a model of its own (its own S3 prefix), as scale.py")
    args = p.parse_args(argv)
    nss = [f"idle-{i:02d}" for i in range(args.namespaces)]
    result = {"benchmark": "idle", "machine": common.machine(), "args": vars(args)}
    # One 1-GPU predictor per DecisionModel, eight per simulated A100 node, and a spare node (as scale.py).
    with fleet.Stack(nss, operator_env=common.parse_env(args.operator_env), keep=args.keep,
                      gpu_nodes=args.count // 8 + 2, watch=args.watch) as stack:
        stack.start_operator()
        setup = run_scale(stack, args.count, nss, args.timeout, own_models=args.model_per_dm)
        scale.print_scale(setup)
        setup.pop("_op_counter")
        result["setup"] = setup
        if not setup["all_ready"]:
            common.log("not all DecisionModels became Ready; the idle window is still measured")
        # All Ready is not the end of the operator's work: passes its own writes triggered may still be queued.
        t_quiet = time.monotonic()
        while time.monotonic() - t_quiet < args.settle_max:
            stack.flush_audit()
            now = time.time()
            recent = common.audit_requests(stack.audit_log, common.OPERATOR_USER, now - args.settle - 2, now)
            if not any(v != "watch" for v, _ in recent):
                break
            time.sleep(2.0)
        result["settle_seconds"] = time.monotonic() - t_quiet
        common.log(f"operator quiet after {result['settle_seconds']:.0f}s more")
        stats = stack.stats()
        writes0 = len(stack.op.writes())
        cpu0, wall0 = stats.cpu_seconds(), time.time()
        metrics0 = common.metrics_requests(stack.api)
        common.log(f"idle window: {args.seconds:.0f}s")
        time.sleep(args.seconds)
        cpu1, wall1 = stats.cpu_seconds(), time.time()
        metrics1 = common.metrics_requests(stack.api)
        writes = stack.op.writes()[writes0:]
        rss = stats.rss()
        stack.flush_audit()
        op_req = common.audit_requests(stack.audit_log, common.OPERATOR_USER, wall0, wall1)
        others = common.audit_requests(stack.audit_log, None, wall0, wall1) - op_req
    minutes = (wall1 - wall0) / 60
    non_watch = {k: n for k, n in op_req.items() if k[0] != "watch"}
    watch = {k: n for k, n in op_req.items() if k[0] == "watch"}
    metrics_diff = metrics1 - metrics0
    result.update({
        "window_seconds": wall1 - wall0,
        "operator_requests_per_minute": sum(non_watch.values()) / minutes,
        "operator_requests": common.counter_json(common.Counter(non_watch)),
        "operator_watch_restarts": common.counter_json(common.Counter(watch)),
        "operator_writes": writes,
        "operator_cpu_seconds": cpu1 - cpu0,
        "operator_cpu_percent": 100 * (cpu1 - cpu0) / (wall1 - wall0),
        "operator_rss_bytes": rss,
        "other_clients_requests": common.counter_json(others),
        "metrics_requests_all_clients": common.counter_json(metrics_diff),
    })
    print(f"\n## Idle: {args.count} Ready DecisionModels, {args.seconds:.0f} s window\n")
    print(common.table(["measure", "value", "target"], [
        ("operator requests / min (watch aside)", result["operator_requests_per_minute"], "0"),
        ("operator writes in the window", len(writes), "0"),
        ("operator watch requests ended (stream restarts)", sum(watch.values()), ""),
        ("operator CPU (s) / % of one core", f"{cpu1 - cpu0:.2f} / {result['operator_cpu_percent']:.2f}", ""),
        ("operator RSS (MiB)", rss / 2**20, ""),
        ("apiserver_request_total diff, all clients", sum(metrics_diff.values()), ""),
        ("settle: all Ready -> operator quiet (s)", result["settle_seconds"], ""),
        ("setup: all Ready (s) / peak RSS (MiB)",
         f"{setup['all_ready_seconds']:.1f} / {setup['operator_peak_rss_bytes'] / 2**20:.0f}", ""),
    ]))
    if non_watch or watch:
        print("\nOperator requests in the window (audit log):\n")
        print(common.table(["verb", "resource", "requests", "per minute"],
                           common.counter_rows(common.Counter(op_req), minutes)))
    print(f"\nTarget: zero idle requests -> {'met' if not non_watch else 'NOT met'}")
    common.write_json(result, args.out, "idle.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
