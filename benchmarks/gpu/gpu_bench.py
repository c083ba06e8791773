"""GPU benchmark: decisions/s and p50/p99 latency through the decision server and directly against vLLM.

    python3 benchmarks/gpu/gpu_bench.py [--tp 1 2] [--out DIR]      # starts and stops its own stack per TP

For each trajectory mode (scored, generated) and each concurrency (1, 16, 64), the same applicants are decided
  direct: the runtime's own upstream request body POSTed to vLLM's /v1/chat/completions (no decision server)
  server: the applicant POSTed to the decision server's /v1/decisions (validation, upstream call, checks, audit)
Closed loop: `c` requests in flight, each worker sending its next request when its last is answered. Before each
mode's cells, one pass over every prompt warms vLLM's prefix cache for both paths alike.
The decision server's overhead is reported as (server p50 - direct p50) / direct p50 at concurrency 64 (target
< 5%), and from the server's own Server-Timing header (its total minus its upstream time per decision).
Writes bench-tpN.json with --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import stack
import underwriting as uw
from direct import Modes, chat_url

BENCH_SEED = 4242
CONCURRENCY = (1, 16, 64)
# Requests per cell; each cell also stops at MAX_SECONDS (generated mode writes ~150 tokens per decision).
REQUESTS = {"scored": {1: 200, 16: 800, 64: 2560}, "generated": {1: 40, 16: 240, 64: 640}}
MAX_SECONDS = {"scored": 15.0, "generated": 20.0}
if os.environ.get("GPU_BENCH_QUICK") == "1":  # a short re-run when little GPU time is left
    MAX_SECONDS = {"scored": 8.0, "generated": 8.0}
if stack.STANDIN:  # the plumbing dry run on a laptop: a few requests per cell
    REQUESTS = {m: {c: max(2 * c, 16) for c in CONCURRENCY} for m in REQUESTS}
    MAX_SECONDS = {"scored": 3.0, "generated": 3.0}

_TIMING = re.compile(r"(\w+);dur=([0-9.]+)")


def server_own_ms(results: list[loadgen.Result]) -> dict | None:
    """Per decision: the server's total time minus the time it waited for vLLM (from its Server-Timing header)."""
    own = []
    for r in results:
        if r.status == 200 and r.server_timing:
            parts = dict(_TIMING.findall(r.server_timing))
            if "total" in parts and "upstream" in parts:
                own.append(float(parts["total"]) - float(parts["upstream"]))
    if not own:
        return None
    return {"p50_ms": round(loadgen.percentile(own, 50), 3), "p99_ms": round(loadgen.percentile(own, 99), 3)}


def validity(modes: Modes, mode: str, target: str, results: list[loadgen.Result]) -> float:
    ok = 0
    for r in results:
        if r.status != 200:
            continue
        if target == "direct":
            ok += modes.validate(mode, r.body)[0]
        else:
            ok += isinstance(r.body, dict) and r.body.get("source") == "model"
    return round(ok / len(results), 4) if results else 0.0


async def bench(tp: int, modes: Modes, concurrency=CONCURRENCY, modes_list=("scored", "generated")) -> dict:
    apps = uw.applicants(3000, BENCH_SEED)
    cells = []
    for mode in modes_list:
        direct_bodies = [modes.body(mode, a) for a in apps]
        server_url = stack.runtime_url(mode) + "/v1/decisions"
        warm_n = max(REQUESTS[mode].values())
        await loadgen.closed_loop(chat_url(), direct_bodies, 64, n=warm_n, max_seconds=MAX_SECONDS[mode] * 1.5)
        for c in concurrency:
            n = REQUESTS[mode][c]
            for target in ("direct", "server"):
                url, bodies = (chat_url(), direct_bodies) if target == "direct" else (server_url, apps)
                await loadgen.closed_loop(url, bodies, c, n=max(2 * c, 8), max_seconds=10)  # warm-up, discarded
                run = await loadgen.closed_loop(url, bodies, c, n=n, max_seconds=MAX_SECONDS[mode])
                cell = {"tp": tp, "mode": mode, "target": target, "concurrency": c, **run.stats(),
                        "valid_share": validity(modes, mode, target, run.results)}
                if target == "server":
                    cell["server_own"] = server_own_ms(run.results)
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    summary = {}
    for mode in modes_list:
        for c in concurrency:
            d = next(x for x in cells if x["mode"] == mode and x["target"] == "direct" and x["concurrency"] == c)
            s = next(x for x in cells if x["mode"] == mode and x["target"] == "server" and x["concurrency"] == c)
            if d["p50_ms"] and s["p50_ms"]:
                summary[f"{mode}_c{c}_overhead_p50_ratio"] = round((s["p50_ms"] - d["p50_ms"]) / d["p50_ms"], 4)
    return {"tp": tp, "cells": cells, "overhead": summary}


def table(results: list[dict]) -> str:
    rows = ["| TP | mode | path | conc. | decisions/s | p50 ms | p99 ms | valid | server own p50 ms |",
            "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for c in res["cells"]:
            own = (c.get("server_own") or {}).get("p50_ms", "")
            rows.append(f"| {c['tp']} | {c['mode']} | {c['target']} | {c['concurrency']} | {c['decisions_per_s']} | "
                        f"{c['p50_ms']} | {c['p99_ms']} | {c['valid_share']:.0%} | {own} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from gpu_check import start_stack

    results = []
    for tp in args.tp:
        async def go(tp=tp):
            t = await start_stack(tp)
            await stack.wait_ready(stack.runtime_url("scored") + "/v2/health/ready", 300, "runtime-scored")
            await stack.wait_ready(stack.runtime_url("generated") + "/v2/health/ready", 60, "runtime-generated")
            res = await bench(tp, await Modes.create())
            res.update(t)
            return res

        try:
            results.append(asyncio.run(go()))
        finally:
            stack.stop_all()
            time.sleep(3)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"bench-tp{tp}.json").write_text(json.dumps(results[-1], indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
