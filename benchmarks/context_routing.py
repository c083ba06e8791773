"""Context routing: what forwarding a pinned context costs its callers.

    .venv/bin/python benchmarks/context_routing.py [--requests 3000] [--concurrency 1,64] [--rounds 3] [--quick]

Processes on loopback: the stable version's decision server (`arbiter-runtime serve`, v1) and the pinned version's
(v2), each in front of its own *instant upstream* (runtime_overhead.py's: a real scored vLLM-format answer sent at
once, so the figures are the decision servers' and not a model's), and the load generator (one raw keep-alive
HTTP/1.1 connection per concurrent caller, closed loop, V2 infer of one row with `x-decision-context:
underwriting`). routing.json next to each decision.json pins that context to v2 (taken up without a restart).

  direct   the callers send the context straight to v2, which decides it: what the pinned version costs anyway
  routed   the callers send it to v1 (as through the stable Service), which forwards it to v2 and answers with
           v2's answer: the routing path

The difference is the extra latency of the routing path. Per run: the callers' p50/p99, decisions/s, and the CPU
the forwarding server spent per request (/proc). Every process shares the same CPUs; `--rounds N` interleaves the
runs N times and reports the median of each, so drift on a shared machine shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "benchmarks")]

import runtime_overhead as ro  # noqa: E402  (instant upstream, canned answer, load generator)

CONTEXT = b"x-decision-context: underwriting\r\n"
INFER = "/v2/models/bench/infer"


def counters(port: int) -> dict[str, float]:
    """What the forwarding server counted: requests forwarded, and decisions of its own (none should be routed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    def total(pattern: str) -> float:
        return sum(float(v) for v in re.findall(pattern + r"\{[^}]*\} ([\d.e+]+)", text))
    return {"forwarded": total(r'arbiter_routed_requests_total(?=\{[^}]*result="forwarded")'),
            "decisions": total("arbiter_decisions_total")}


def start(work: Path, env: dict[str, str], version: str, canned: Path, model_dir: Path) -> tuple[list, int]:
    from arbiter_devenv.vllm_standin import free_port

    up, rt = free_port(), free_port()
    d = work / version
    d.mkdir()
    cfg = dict(ro.CONFIG, version=version, upstream=dict(ro.CONFIG["upstream"], url=f"http://127.0.0.1:{up}/v1"))
    (d / "decision.json").write_text(json.dumps(cfg))
    procs = [subprocess.Popen([sys.executable, ro.__file__, "--serve-instant", str(up), str(canned)], env=env),
             subprocess.Popen([sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(d / "decision.json"),
                               "--port", str(rt), "--host", "127.0.0.1", "--model-dir", str(model_dir)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    ro.wait_http(up, "/health")
    ro.wait_http(rt, "/v2/health/ready")
    return procs, rt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None, help="requests per run (default 3000; --quick: 200)")
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="CI smoke: few requests, checks that it completes")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "context_routing.json"))
    args = p.parse_args()
    requests = args.requests or (200 if args.quick else 3000)
    levels = [int(c) for c in args.concurrency.split(",")]

    from arbiter_devenv.vllm_standin import write_model_dir

    work = Path(tempfile.mkdtemp(prefix="arbiter-routing-bench-"))
    canned = ro.canned_response(work)
    model_dir = write_model_dir(work / "model", ro.LABELS, "bench")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "runtime"))
    procs: list[subprocess.Popen] = []
    results = []
    try:
        v1, p1 = start(work, env, "v1", canned, model_dir)
        v2, p2 = start(work, env, "v2", canned, model_dir)
        procs += v1 + v2
        routes = {"routes": [{"header": "x-decision-context", "value": "underwriting", "version": "v2",
                              "url": f"http://127.0.0.1:{p2}", "timeoutMs": 10000}]}
        for version in ("v1", "v2"):
            (work / version / "routing.json").write_text(json.dumps(routes))
        time.sleep(2.5)  # the runtimes read routing.json every 2 s
        bodies = ro.documents(256)
        for port in (p1, p2):  # warm-up: connections (v1's to v2 included), caches
            asyncio.run(ro.load(port, INFER, bodies, 8, 400, CONTEXT))
        forwarder = v1[1].pid
        for _ in range(args.rounds):
            for concurrency in levels:
                for run, port in (("direct", p2), ("routed", p1)):
                    cpu0 = ro.cpu_seconds(forwarder)
                    lat, _own, elapsed = asyncio.run(ro.load(port, INFER, bodies, concurrency,
                                                             max(requests, concurrency * 4), CONTEXT))
                    cpu = ro.cpu_seconds(forwarder) - cpu0
                    results.append({"run": run, "concurrency": concurrency, "requests": len(lat),
                                    "p50_ms": ro.pct(lat, 50) * 1e3, "p99_ms": ro.pct(lat, 99) * 1e3,
                                    "decisions_per_s": len(lat) / elapsed,
                                    "forwarder_cpu_ms_per_request": cpu / len(lat) * 1e3 if run == "routed" else 0.0})
        counted = counters(p1)
    finally:
        ro.stop_all(procs, work)
    print(f"{'run':<8} {'c':>3} {'reqs':>5} {'p50 ms':>7} {'p99 ms':>7} {'dec/s':>6} {'fwd cpu ms/req':>14}")
    for r in results:
        print(f"{r['run']:<8} {r['concurrency']:>3} {r['requests']:>5} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
              f"{r['decisions_per_s']:>6.0f} {r['forwarder_cpu_ms_per_request']:>14.3f}")
    summary = {}
    for concurrency in levels:
        med = {run: {k: statistics.median(r[k] for r in results if r["run"] == run and r["concurrency"] == concurrency)
                     for k in ("p50_ms", "p99_ms", "decisions_per_s", "forwarder_cpu_ms_per_request")}
               for run in ("direct", "routed")}
        extra = med["routed"]["p50_ms"] - med["direct"]["p50_ms"]
        summary[str(concurrency)] = {**med, "extra_p50_ms": extra,
                                     "extra_p99_ms": med["routed"]["p99_ms"] - med["direct"]["p99_ms"]}
        print(f"c={concurrency}: routing adds {extra:.2f} ms at p50, "
              f"{summary[str(concurrency)]['extra_p99_ms']:.2f} ms at p99 (median of {args.rounds})")
    out = {"benchmark": "context_routing", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "load_average": os.getloadavg()},
           "stable_counted": counted, "results": results, "summary": summary}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
