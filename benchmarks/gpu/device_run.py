"""The GPU runs in two phases that share one serving stack (a vLLM start costs 1-2 minutes of GPU time).

    python3 benchmarks/gpu/device_run.py phase1 --out DIR   # TP1: start stack, gpu_check, gpu_bench; stack stays up
    python3 benchmarks/gpu/device_run.py phase2 --out DIR   # kill vLLM under load -> rules; restart it as TP2 ->
                                                            # model again; TP2 checks and bench; stop everything
    python3 benchmarks/gpu/device_run.py all --out DIR      # both, in one command (needs ~12 minutes)

On a two-GPU machine TP1 runs on GPU 0 and TP2 on GPUs 0 and 1. The vLLM that comes back after the kill is the
TP2 server on the same port, so the hand-back is measured on the way to the TP2 numbers. Phase 1 leaves its
processes running in their own sessions; phase 2 finds them through stack.STATE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_bench
import gpu_check
import stack
from direct import Modes


def write(out: Path, name: str, obj) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(obj, indent=2))


async def start_vllm_checked(tp: int, then=None) -> dict:
    """Start vLLM with the operator's arguments. If vLLM refuses one of them, that is a finding: record it, drop the
    flag and go on, so the rest of the run still measures something."""
    args = stack.vllm_args(tp)
    dropped = []
    t0 = time.time()
    for _ in range(3):
        stack.start_vllm(tp, args)
        if then is not None:
            await asyncio.sleep(5)  # the decision servers start meanwhile; they wait for the upstream themselves
            then()
            then = None
        try:
            await stack.wait_ready(stack.VLLM_URL + "/health", 480, "vllm")
            return {"vllm_args": args, "dropped_operator_args": dropped, "vllm_start_s": round(time.time() - t0, 1)}
        except RuntimeError as exc:
            text = str(exc)
            bad = [a for a in args[1:]
                   if a.split("=")[0] in text and re.search(r"error|unrecognized|invalid", text, re.I)]
            if not bad:
                raise
            dropped.append({"arg": bad[0], "vllm_said": text[-1500:]})
            args = [a for a in args if a != bad[0]]
            print(f"vLLM refused {bad[0]}; retrying without it", flush=True)
    raise RuntimeError("vLLM did not start")


def start_runtimes() -> None:
    for mode in ("scored", "generated"):
        if stack.pid(f"runtime-{mode}") is None:
            stack.start_runtime(mode)


async def phase1(out: Path, n: int) -> dict:
    res: dict = {"phase": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    res["start"] = await start_vllm_checked(1, then=start_runtimes)
    print(json.dumps(res["start"]), flush=True)
    check = await gpu_check.run_checks(1, n)
    by_input = check.pop("decisions_by_input")
    (stack.STATE / "tp1-decisions.json").write_text(json.dumps(by_input))
    res["check"] = check
    write(out, "check-tp1.json", res)
    print(json.dumps({k: v for k, v in check.items() if k not in ("endpoints",)}, indent=1)[:6000], flush=True)
    print("endpoints all pass:", check["endpoints"]["all_pass"], flush=True)
    bench = await gpu_bench.bench(1, await Modes.create())
    write(out, "bench-tp1.json", bench)
    print(gpu_bench.table([bench]), flush=True)
    print(json.dumps(bench["overhead"]), flush=True)
    return res


async def phase2(out: Path, n: int) -> dict:
    res: dict = {"phase": 2, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if stack.pid("vllm") is None:
        # Phase 1's stack is gone (a fresh machine): serve TP2 first, measure the hand-back at the end instead.
        res["start"] = await start_vllm_checked(2, then=start_runtimes)
        res["fallback_at_end"] = True
    else:
        t0 = time.time()
        res["fallback"] = await gpu_check.fallback_handback(lambda: stack.start_vllm(2))
        res["start"] = {"tp": 2, "kill_to_tp2_healthy_s": round(time.time() - t0, 1)}
        print(json.dumps(res["fallback"], indent=1), flush=True)
    check = await gpu_check.run_checks(2, n)
    by_input = check.pop("decisions_by_input")
    try:
        tp1 = json.loads((stack.STATE / "tp1-decisions.json").read_text())
        common = [k for k in by_input if k in tp1]
        check["same_decision_as_tp1"] = {"compared": len(common),
                                         "same": sum(by_input[k] == tp1[k] for k in common)}
    except OSError:
        check["same_decision_as_tp1"] = None
    res["check"] = check
    write(out, "check-tp2.json", res)
    print(json.dumps({k: v for k, v in check.items() if k not in ("endpoints",)}, indent=1)[:5000], flush=True)
    print("endpoints all pass:", check["endpoints"]["all_pass"], flush=True)
    bench = await gpu_bench.bench(2, await Modes.create())
    write(out, "bench-tp2.json", bench)
    print(gpu_bench.table([bench]), flush=True)
    print(json.dumps(bench["overhead"]), flush=True)
    if res.get("fallback_at_end"):
        res["fallback"] = await gpu_check.fallback_handback(lambda: stack.start_vllm(2))
        print(json.dumps(res["fallback"], indent=1), flush=True)
    write(out, "check-tp2.json", res)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("phase", choices=["phase1", "phase2", "all"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=1000, help="scored-mode decisions checked for validity (>= 500)")
    args = ap.parse_args(argv)
    try:
        if args.phase in ("phase1", "all"):
            asyncio.run(phase1(args.out, args.n))
        if args.phase in ("phase2", "all"):
            asyncio.run(phase2(args.out, args.n))
            stack.stop_all()
    except BaseException:
        for name in ("vllm", "runtime-scored", "runtime-generated"):
            print(f"--- {name} log tail ---\n{stack.tail(name, 30)}", flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
