"""The decision server under hostile input: a property fuzz of the HTTP surface, and the deadline fallback's bound.

    .venv/bin/python benchmarks/runtime_fuzz.py fuzz [--cases 20000] [--upstream standin,hostile] [--mode scored]
    .venv/bin/python benchmarks/runtime_fuzz.py deadline [--deadline-ms 250] [--concurrency 64] [--requests 3200]

fuzz: hypothesis generates hostile requests (bad Unicode incl. lone surrogates, numbers with hundreds of digits,
1200 vs 1200.0, deep nesting, wrong content types, chunked bodies, malformed V2 bodies, raw bytes) against the
decision server in front of (a) the vLLM stand-in and (b) the hostile upstream of tests/support/hostile_upstream.py
(wrong types, missing fields, truncation, resets, slow answers, impossible and contradicting numbers). Every answer
goes through the oracle of tests/support/fuzz_surface.py; it prints, per upstream, the cases, the answers by
status, and the three counts that must be 0: server errors (a 5xx other than a 503 with a reason, or a broken
connection), inconsistent decisions, audit mismatches (records != rows delivered). Exit code 1 if any is not 0.

deadline: the stand-in made slower than the deadline (every decision must fall back on `deadline`); the decision
server (`arbiter-runtime serve`, its own process) under a closed loop of `--concurrency` callers; prints p50/p99/max
of the answers against deadlineMs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))  # the support package
sys.path.insert(0, str(ROOT / "tests" / "cluster" / "runtime"))  # test_hostile_surface


def fuzz(args) -> int:
    import logging

    from hypothesis import HealthCheck, Phase, given, settings

    logging.disable(logging.WARNING)  # the runtime logs every fallback-rule miss; the tally is the output
    from support.fuzz_surface import cases
    from test_hostile_surface import Surface

    def run_cases(surface, strategy) -> None:
        """Hypothesis cases against one surface, tallied by its oracle (failures are counted, not raised)."""
        @settings(max_examples=args.cases, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case):
            surface.oracle.check(surface.client, case, surface.hostile)

        run()

    failed = False
    for upstream in args.upstream.split(","):
        surface = Surface(hostile=upstream == "hostile", mode=args.mode)
        started = time.perf_counter()
        try:
            run_cases(surface, cases(hostile=upstream == "hostile"))
        finally:
            surface.close()
        t = surface.oracle.tally
        elapsed = time.perf_counter() - started
        print(f"{upstream:>8} {args.mode}: {t.summary()} ({elapsed:.0f} s, {t.cases / elapsed:.0f} cases/s)")
        if surface.hostile is not None:
            print(f"{'':>8} hostile behaviours served: {sum(surface.hostile.calls.values())} calls, "
                  f"{len(surface.hostile.calls)} kinds")
        for label, items in (("server error", t.server_errors), ("inconsistent", t.inconsistent),
                             ("audit", t.audit_mismatches)):
            for item in items[:5]:
                print(f"    {label}: {item[:400]}")
        failed |= not t.ok()
    return 1 if failed else 0


async def _caller(port: int, body: bytes, count: int, lat: list, sources: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (b"POST /v1/decisions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body))
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            writer.write(head + body)
            header = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length:\s*(\d+)", header)
            payload = json.loads(await reader.readexactly(int(m.group(1))))
            lat.append(time.perf_counter() - t0)
            t = re.search(rb"(?i)server-timing:[^\r]*total;dur=([\d.]+)", header)
            if t:
                sources.setdefault("_server_ms", []).append(float(t.group(1)))
            key = f"{header.split(b' ')[1].decode()} {payload.get('source')} {payload.get('fallbackReason')}"
            sources[key] = sources.get(key, 0) + 1
    finally:
        writer.close()


def deadline(args) -> int:
    import httpx
    from arbiter_devenv.vllm_standin import free_port, write_model_dir
    from support.runtime_helpers import LABELS, base_config

    work = Path(tempfile.mkdtemp(prefix="arbiter-fuzz-"))
    up_port, rt_port = free_port(), free_port()
    model_dir = write_model_dir(work / "model", LABELS, "credit-v1")
    cfg = base_config(f"http://127.0.0.1:{up_port}/v1", deadlineMs=args.deadline_ms)
    (work / "decision.json").write_text(json.dumps(cfg))
    # ARBITER_BENCH_RUNTIME: the runtime package directory to measure (default: this checkout's), to compare versions
    env = dict(os.environ, PYTHONPATH=os.environ.get("ARBITER_BENCH_RUNTIME", str(ROOT / "runtime")))
    upstream = subprocess.Popen([sys.executable, "-m", "arbiter_devenv.vllm_standin", "--port", str(up_port),
                                 "--served-model-name", "credit-v1", "--words", ",".join(LABELS),
                                 "--behaviour", "slow", "--delay-s", str(args.deadline_ms / 1000 * 20)], env=env)
    server = subprocess.Popen([sys.executable, "-m", "arbiter_runtime", "serve", "--config",
                               str(work / "decision.json"), "--port", str(rt_port), "--host", "127.0.0.1",
                               "--model-dir", str(model_dir)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        t_end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{rt_port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > t_end:
                raise RuntimeError("decision server not ready")
            time.sleep(0.1)
        body = json.dumps({"amount": 1200, "country": "DE"}).encode()
        lat: list[float] = []
        sources: dict[str, int] = {}
        per = max(1, args.requests // args.concurrency)
        warm: list[float] = []
        # warm-up: --warmup rounds at full concurrency (the server learns its deadline reserve), reported apart
        asyncio.run(_gather(rt_port, body, args.concurrency, args.warmup, warm, {"_server_ms": []}))
        t0 = time.perf_counter()
        asyncio.run(_gather(rt_port, body, args.concurrency, per, lat, sources))
        elapsed = time.perf_counter() - t0
    finally:
        for proc in (server, upstream):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    lat.sort()
    server_ms = sorted(sources.pop("_server_ms", []))
    sq = lambda p: server_ms[min(len(server_ms) - 1, round(p / 100 * (len(server_ms) - 1)))]  # noqa: E731
    q = lambda p: lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))] * 1000  # noqa: E731
    over = sum(1 for x in lat if x * 1000 > args.deadline_ms)
    warm.sort()
    if warm:
        p99 = warm[min(len(warm) - 1, int(0.99 * (len(warm) - 1)))] * 1000
        print(f"warm-up: {len(warm)} answers, p99 {p99:.1f} ms, "
              f"max {warm[-1] * 1000:.1f} ms, over the deadline: {sum(1 for x in warm if x * 1000 > args.deadline_ms)}")
    print(f"deadline fallback, deadlineMs={args.deadline_ms}, concurrency {args.concurrency}, {len(lat)} answers "
          f"in {elapsed:.1f} s: p50 {q(50):.1f} ms, p99 {q(99):.1f} ms, max {lat[-1] * 1000:.1f} ms; "
          f"p99 - deadline = {q(99) - args.deadline_ms:+.1f} ms; over the deadline: {over}; answers: {sources}; "
          f"server exit code {server.returncode}")
    if server_ms:
        print(f"inside the server (Server-Timing total, request head read to answer): p50 {sq(50):.1f} ms, "
              f"p99 {sq(99):.1f} ms, max {server_ms[-1]:.1f} ms")
    return 0 if q(99) <= args.deadline_ms else 1


async def _gather(port, body, concurrency, per, lat, sources):
    await asyncio.gather(*(_caller(port, body, per, lat, sources) for _ in range(concurrency)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fuzz")
    f.add_argument("--cases", type=int, default=20000, help="cases per upstream")
    f.add_argument("--upstream", default="standin,hostile")
    f.add_argument("--mode", default="scored", choices=["scored", "generated"])
    d = sub.add_parser("deadline")
    d.add_argument("--deadline-ms", type=int, default=250)
    d.add_argument("--concurrency", type=int, default=64)
    d.add_argument("--requests", type=int, default=3200)
    d.add_argument("--warmup", type=int, default=5, help="rounds per caller before measuring")
    args = p.parse_args()
    return fuzz(args) if args.cmd == "fuzz" else deadline(args)


if __name__ == "__main__":
    sys.exit(main())
