"""Shadow overhead: what mirroring to a candidate costs the stable version's callers.

    .venv/bin/python benchmarks/shadow_overhead.py [--requests 3000] [--concurrency 64] [--pin] [--quick] [--json F]

Processes on loopback: the stable decision server (`arbiter-runtime serve`, version v1) and the candidate's (v2),
each in front of its own *instant upstream* (runtime_overhead.py's: a real scored vLLM-format answer made by the
stand-in, sent at once, so the figures are the decision servers' and not a model's), and this load generator (one
raw keep-alive HTTP/1.1 connection per concurrent caller, closed loop, V2 infer of one row). Only the stable is
called; shadow.json next to its decision.json is rewritten between runs (taken up without a restart):

  off        no shadow.json
  rate 0.1   {"sampleRate": 0.1} to the candidate
  rate 1.0   every request mirrored
(`--rounds N` repeats the three, interleaved, and prints the median of each.)

Per run: the callers' p50/p99/max latency, decisions/s, the stable server's CPU per decision (/proc) and the
shadow counters it reports (sent, dropped, compared, error; agreement). Every process shares the same CPUs, so at
rate 1.0 the candidate's own work (a second decision per request) competes with the stable's on a small machine;
in a cluster the candidate runs on its own pods and only the stable's mirroring work (the CPU column) remains.
`--pin` models that: the stable's processes and the load generator on one half of the CPUs, the candidate's on the
other.
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


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def shadow_counts(port: int) -> dict[str, float]:
    text = scrape(port)
    out: dict[str, float] = {}
    for result in ("sent", "dropped", "error", "compared"):
        m = re.search(rf'arbiter_shadow_requests_total\{{[^}}]*result="{result}"[^}}]*\}} ([\d.e+]+)', text)
        out[result] = float(m.group(1)) if m else 0.0
    agree = sum(float(v) for v in re.findall(r'arbiter_shadow_comparisons_total\{[^}]*agree="true"[^}]*\} ([\d.e+]+)',
                                             text))
    out["agreeing_rows"] = agree
    m = re.search(r"arbiter_shadow_in_flight\{[^}]*\} ([\d.e+]+)", text)
    out["in_flight"] = float(m.group(1)) if m else 0.0
    return out


def drain(port: int, timeout: float = 30.0) -> None:
    """Wait until no mirrored request is waiting for the candidate."""
    deadline = time.monotonic() + timeout
    while shadow_counts(port)["in_flight"] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def pin(pid: int, cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(pid, cpus)


def write_shadow(path: Path, cfg: dict | None) -> None:
    if cfg is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg))
    tmp.replace(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None, help="requests per run (default 3000; --quick: 300)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="CI smoke: few requests, checks that it completes")
    p.add_argument("--rounds", type=int, default=1, help="repeat off / rate 0.1 / rate 1.0 this many times, "
                   "interleaved, so drift on a shared machine shows (the summary gives the median of each)")
    p.add_argument("--pin", action="store_true",
                   help="the stable (server, upstream, load generator) on the first half of the CPUs, the candidate "
                        "on the other half: the candidate's work stays off the stable's CPUs, as on its own pods")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "shadow_overhead.json"))
    args = p.parse_args()
    requests = args.requests or (300 if args.quick else 3000)

    from arbiter_devenv.vllm_standin import free_port, write_model_dir

    work = Path(tempfile.mkdtemp(prefix="arbiter-shadow-bench-"))
    canned = ro.canned_response(work)
    model_dir = write_model_dir(work / "model", ro.LABELS, "bench")  # the instant upstream has no /tokenize
    env = dict(os.environ, PYTHONPATH=str(ROOT / "runtime"))
    procs: list[subprocess.Popen] = []
    ports: dict[str, int] = {}
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    placement = {"v1": set(cpus[:half]), "v2": set(cpus[half:]) or set(cpus)} if args.pin else {"v1": None, "v2": None}
    pin(0, placement["v1"])  # the load generator sits with the stable
    try:
        for version in ("v1", "v2"):
            up, rt = free_port(), free_port()
            ports[version] = rt
            d = work / version
            d.mkdir()
            cfg = dict(ro.CONFIG, version=version,
                       upstream=dict(ro.CONFIG["upstream"], url=f"http://127.0.0.1:{up}/v1"))
            (d / "decision.json").write_text(json.dumps(cfg))
            procs.append(subprocess.Popen([sys.executable, ro.__file__, "--serve-instant", str(up), str(canned)],
                                          env=env))
            procs.append(subprocess.Popen([sys.executable, "-m", "arbiter_runtime", "serve", "--config",
                                           str(d / "decision.json"), "--port", str(rt), "--host", "127.0.0.1",
                                           "--model-dir", str(model_dir)],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for proc in procs[-2:]:
                pin(proc.pid, placement[version])
            ro.wait_http(up, "/health")
            ro.wait_http(rt, "/v2/health/ready")
        stable_pid = procs[1].pid
        shadow = work / "v1" / "shadow.json"
        bodies = ro.documents(256)
        infer = "/v2/models/bench/infer"
        asyncio.run(ro.load(ports["v1"], infer, bodies, 8, 400))  # warm-up: connections, caches
        asyncio.run(ro.load(ports["v2"], infer, bodies, 8, 400))
        runs = [("off", None), ("rate 0.1", 0.1), ("rate 1.0", 1.0)] * args.rounds
        results = []
        for name, rate in runs:
            cfg = None if rate is None else {"candidate": "v2", "url": f"http://127.0.0.1:{ports['v2']}",
                                             "sampleRate": rate, "timeoutMs": 2000, "maxInFlight": 256}
            write_shadow(shadow, cfg)
            time.sleep(2.5)  # the runtime re-reads shadow.json every 2 s
            # steady state, as in service: the mirror's connections to the candidate are open before measuring
            asyncio.run(ro.load(ports["v1"], infer, bodies, 8, 400))
            drain(ports["v1"])
            before = shadow_counts(ports["v1"])
            cpu0 = ro.cpu_seconds(stable_pid)
            lat, own, elapsed = asyncio.run(ro.load(ports["v1"], infer, bodies, args.concurrency,
                                                    max(requests, args.concurrency * 4)))
            cpu = ro.cpu_seconds(stable_pid) - cpu0
            drain(ports["v1"])
            after = shadow_counts(ports["v1"])
            delta = {k: after[k] - before[k] for k in ("sent", "dropped", "error", "compared", "agreeing_rows")}
            results.append({
                "run": name, "sample_rate": rate, "concurrency": args.concurrency, "requests": len(lat),
                "p50_ms": ro.pct(lat, 50) * 1e3, "p99_ms": ro.pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3,
                "decisions_per_s": len(lat) / elapsed, "stable_cpu_ms_per_decision": cpu / len(lat) * 1e3,
                "own_p50_ms": ro.pct(own, 50) * 1e3, **{f"shadow_{k}": v for k, v in delta.items()},
            })
    finally:
        ro.stop_all(procs, work)
    print(f"{'run':<10} {'reqs':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'dec/s':>6} {'cpu ms/dec':>10} "
          f"{'sent':>5} {'dropped':>7} {'compared':>8} {'error':>5} {'agree':>6}")
    for r in results:
        agree = (r["shadow_agreeing_rows"] / r["shadow_compared"]) if r["shadow_compared"] else float("nan")
        print(f"{r['run']:<10} {r['requests']:>5} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.1f} "
              f"{r['decisions_per_s']:>6.0f} {r['stable_cpu_ms_per_decision']:>10.3f} {r['shadow_sent']:>5.0f} "
              f"{r['shadow_dropped']:>7.0f} {r['shadow_compared']:>8.0f} {r['shadow_error']:>5.0f} {agree:>6.2f}")
    if args.rounds > 1:
        print(f"\nmedian of {args.rounds} rounds:")
        for name in ("off", "rate 0.1", "rate 1.0"):
            rows = [r for r in results if r["run"] == name]
            med = {k: statistics.median(r[k] for r in rows) for k in ("p50_ms", "p99_ms", "decisions_per_s",
                                                                        "stable_cpu_ms_per_decision")}
            print(f"{name:<10} p50 {med['p50_ms']:.2f} ms  p99 {med['p99_ms']:.2f} ms  {med['decisions_per_s']:.0f} "
                  f"decisions/s  stable CPU {med['stable_cpu_ms_per_decision']:.3f} ms/decision")
    out = {"benchmark": "shadow_overhead", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "load_average": os.getloadavg(), "pinned": bool(args.pin),
                       "placement": {k: sorted(v) if v else None for k, v in placement.items()}},
           "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
