"""Throughput over GPUs: N replicas of one version behind the Service path, and tensor parallel 2 against 2 x TP1.

    python3 benchmarks/gpu/scale_gpus.py replicas --gpus N --arm fp8 --out DIR   # N replicas up; 1, 2, 4, 8 measured
    python3 benchmarks/gpu/scale_gpus.py tp2 --arm fp8 --out DIR                # replicas 0 and 1 give way to one TP2
    python3 benchmarks/gpu/scale_gpus.py report --out DIR
    python3 benchmarks/gpu/scale_gpus.py stop

A replica is what one predictor pod runs: the runtime's supervisor (`arbiter_runtime supervise -- <the operator's
rendered vllm serve arguments>`) with the compact decision.json, on its own GPU (CUDA_VISIBLE_DEVICES=i); replica i
serves on port 8080+i, its vLLM on 8000+i. Every replica starts at once (one start-up for all), then the
measurements use replicas 0..n-1 for n = 1, 2, 4, 8 (those the machine has): idle replicas hold a GPU each and
nothing else.

The Service path: kube-proxy spreads connections, not requests, over a Service's ready pods, and a client keeps its
connections; so each closed-loop worker is bound to one replica (worker w to replica w mod n). Measured per n:
  c=1        one request at a time: the latency a decision has (p50, p99)
  c=64 x n   64 in flight per replica: decisions/s in all and per GPU, and the scaling efficiency
             decisions/s(n) / (n x decisions/s(1)), the figure the target (0.9 or more) is about.
`tp2`: replicas 0 and 1 are stopped and one replica of tensor parallel 2 (the operator's rendering for gpus: 2)
takes GPUs 0 and 1: c=1, c=64 and c=128 through it, against two TP1 replicas at c=1 and c=128 (64 each).

The model is the one bench_7b.py builds, at /mnt/models (ARBITER_GPU_MODEL_DIR); the arm is bench_7b's (bf16, fp8).
With ARBITER_GPU_STANDIN=1 every replica is the vLLM stand-in: the plumbing, not a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
import stack  # noqa: E402
import underwriting as uw  # noqa: E402

ARGS = {("bf16", 1): "vllm-args-tp1.json", ("fp8", 1): "vllm-args-tp1-fp8.json",
        ("bf16", 2): "vllm-args-tp2.json", ("fp8", 2): "vllm-args-tp2-fp8.json"}
PER_REPLICA = 64
SECONDS = float(os.environ.get("SCALE_SECONDS", "15"))
C1_REQUESTS = int(os.environ.get("SCALE_C1", "200"))
SEED = 4244


def _args(arm: str, tp: int, vllm_port: int) -> list[str]:
    return stack.with_args(stack.fixture(ARGS[(arm, tp)]), model_dir=stack.MODEL_DIR, port=vllm_port)


def start_replica(name: str, arm: str, tp: int, gpus: list[int], index: int) -> None:
    cfg = stack.write_config("scored")
    env = {**stack.supervisor_env(), "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    stack.start(name, [sys.executable, "-m", "arbiter_runtime", "supervise", "--config", str(cfg), "--host",
                       "127.0.0.1", "--port", str(8080 + index), "--", *_args(arm, tp, 8000 + index)], env)


async def _ready(names: dict[str, int], timeout: float) -> float:
    t0 = time.time()
    await asyncio.gather(*(stack.wait_ready(f"http://127.0.0.1:{8080 + i}/v2/health/ready", timeout, name)
                           for name, i in names.items()))
    return round(time.time() - t0, 1)


async def measure(ports: list[int], label: str, concurrencies: tuple[int, ...]) -> list[dict]:
    apps = uw.applicants(2000, SEED)
    urls = [f"http://127.0.0.1:{p}/v1/decisions" for p in ports]
    cells = []
    await loadgen.spread(urls, apps, 8 * len(urls), n=16 * len(urls), max_seconds=10)  # warm-up
    for conc in concurrencies:
        run = await loadgen.spread(urls, apps, conc, n=C1_REQUESTS if conc == 1 else 10 ** 6, max_seconds=SECONDS)
        by_model = sum(1 for r in run.results if r.status == 200 and isinstance(r.body, dict)
                       and r.body.get("source") == "model")
        cell = {"setup": label, "replicas": len(ports), "concurrency": conc, **run.stats(),
                "by_model_share": round(by_model / max(len(run.results), 1), 4)}
        cells.append(cell)
        print(json.dumps(cell), flush=True)
    return cells


def replicas(gpus: int, arm: str, out: Path, wait: float) -> dict:
    counts = [n for n in (1, 2, 4, 8) if n <= gpus]
    names = {f"replica-{i}": i for i in range(gpus)}
    for name, i in names.items():
        start_replica(name, arm, 1, [i], i)
    ready_s = asyncio.run(_ready(names, wait))
    print(f"{gpus} replicas ready in {ready_s}s", flush=True)
    cells = []
    for n in counts:
        ports = [8080 + i for i in range(n)]
        cells += asyncio.run(measure(ports, f"{n} x TP1", (1, PER_REPLICA * n)))
    result = {"arm": arm, "gpus": gpus, "ready_s": ready_s, "standin": stack.STANDIN, "cells": cells}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"scale-replicas-{arm}.json").write_text(json.dumps(result, indent=2))
    return result


def tp2(arm: str, out: Path, wait: float) -> dict:
    for i in (0, 1):
        stack.stop_group(f"replica-{i}")
    start_replica("tp2", arm, 2, [0, 1], 0)
    ready_s = asyncio.run(_ready({"tp2": 0}, wait))
    print(f"TP2 ready in {ready_s}s", flush=True)
    cells = asyncio.run(measure([8080], "1 x TP2", (1, PER_REPLICA, 2 * PER_REPLICA)))
    result = {"arm": arm, "ready_s": ready_s, "standin": stack.STANDIN, "cells": cells}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"scale-tp2-{arm}.json").write_text(json.dumps(result, indent=2))
    return result


def report(out: Path) -> str:
    rows = ["| arm | setup | GPUs | conc. | decisions/s | per GPU | scaling | p50 ms | p99 ms | by the model |",
            "|---" * 10 + "|"]
    for path in sorted(out.glob("scale-*.json")):
        result = json.loads(path.read_text())
        one = next((c["decisions_per_s"] for c in result["cells"] if c["setup"] == "1 x TP1" and c["concurrency"] > 1),
                   None)
        for c in result["cells"]:
            gpus = c["replicas"] * (2 if "TP2" in c["setup"] else 1)
            per_gpu = round(c["decisions_per_s"] / gpus, 1) if c["concurrency"] > 1 else ""
            scaling = (f"{c['decisions_per_s'] / (c['replicas'] * one):.2f}" if one and c["concurrency"] > 1
                       and "TP1" in c["setup"] else "")
            rows.append(f"| {result['arm']} | {c['setup']} | {gpus} | {c['concurrency']} | {c['decisions_per_s']} | "
                        f"{per_gpu} | {scaling} | {c['p50_ms']} | {c['p99_ms']} | {c['by_model_share']:.1%} |")
    text = "\n".join(rows)
    (out / "scale-table.md").write_text(text + "\n")
    print(text, flush=True)
    return text


def stop() -> None:
    for path in stack.STATE.glob("replica-*.pid"):
        stack.stop_group(path.stem)
    stack.stop_group("tp2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["replicas", "tp2", "report", "stop"])
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--arm", default="fp8", choices=["bf16", "fp8"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--wait", type=float, default=480)
    args = ap.parse_args(argv)
    try:
        if args.step == "replicas":
            replicas(args.gpus, args.arm, args.out, args.wait)
        elif args.step == "tp2":
            tp2(args.arm, args.out, args.wait)
            stop()
        elif args.step == "report":
            report(args.out)
        else:
            stop()
    except Exception as exc:
        print(f"scale_gpus {args.step} failed: {exc}", flush=True)
        for path in sorted(stack.STATE.glob("*.log")):
            if path.stem.startswith(("replica-", "tp2")):
                print(f"--- {path.stem}\n{stack.tail(path.stem, 30)}", flush=True)
        stop()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
