"""A small closed-loop HTTP load generator (aiohttp) and latency statistics, shared by gpu_check and gpu_bench.

Closed loop: `concurrency` workers each send the next request as soon as their last one is answered, so the
measured decisions/s is what the server sustains at that many requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    index: int
    started: float  # time.perf_counter() when sent
    latency: float  # seconds
    status: int
    body: Any  # decoded JSON, or the error text
    error: str | None = None
    server_timing: str | None = None  # the decision server's Server-Timing header (upstream and total time)


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0

    def stats(self) -> dict[str, Any]:
        ok = [r.latency for r in self.results if r.status == 200]
        return {
            "requests": len(self.results),
            "ok": len(ok),
            "errors": len(self.results) - len(ok),
            "wall_s": round(self.wall, 3),
            "decisions_per_s": round(len(ok) / self.wall, 1) if self.wall else 0.0,
            "p50_ms": round(percentile(ok, 50) * 1000, 2) if ok else None,
            "p99_ms": round(percentile(ok, 99) * 1000, 2) if ok else None,
            "mean_ms": round(sum(ok) / len(ok) * 1000, 2) if ok else None,
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: every reported figure is a latency that was measured)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, math.ceil(q / 100 * len(s)) - 1)
    return s[k]


async def _one(session, url: str, body: Any, index: int, t0: float, timeout: float) -> Result:
    import aiohttp

    start = time.perf_counter()
    try:
        async with session.post(url, data=json.dumps(body), headers={"content-type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            status = resp.status
            timing = resp.headers.get("server-timing")
        latency = time.perf_counter() - start
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = raw[:500].decode(errors="replace")
        return Result(index, start, latency, status, decoded, None, timing)
    except Exception as exc:  # connection refused/reset while an upstream is being killed is a result, not a crash
        return Result(index, start, time.perf_counter() - start, 0, None, f"{type(exc).__name__}: {exc}")


async def closed_loop(url: str, bodies: list[Any], concurrency: int, n: int | None = None,
                      max_seconds: float = 60.0, timeout: float = 60.0) -> Run:
    """Send bodies[i % len(bodies)] for i in range(n) with `concurrency` in flight; stop early at max_seconds."""
    import aiohttp

    n = len(bodies) if n is None else n
    run = Run()
    counter = iter(range(n))
    conn = aiohttp.TCPConnector(limit=concurrency * 2, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        deadline = t0 + max_seconds

        async def worker():
            for i in counter:
                if time.perf_counter() > deadline:
                    return
                run.results.append(await _one(session, url, bodies[i % len(bodies)], i, t0, timeout))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.wall = time.perf_counter() - t0
    run.results.sort(key=lambda r: r.index)
    return run


async def spread(urls: list[str], bodies: list[Any], concurrency: int, n: int, max_seconds: float = 60.0,
                 timeout: float = 60.0) -> Run:
    """`concurrency` workers in all, each bound to one of `urls` (worker i to urls[i % len(urls)]), as a Service
    spreads long-lived client connections over its pods; one Run of every answer, `n` requests at most."""
    per = [concurrency // len(urls) + (i < concurrency % len(urls)) for i in range(len(urls))]
    runs = await asyncio.gather(*(closed_loop(url, bodies, c, n=max(1, n * c // concurrency), max_seconds=max_seconds,
                                              timeout=timeout) for url, c in zip(urls, per, strict=True) if c))
    merged = Run(results=[r for run in runs for r in run.results], wall=max(run.wall for run in runs))
    return merged


async def open_loop(url: str, bodies: list[Any], rate: float, seconds: float, timeout: float = 30.0,
                    stop: asyncio.Event | None = None) -> Run:
    """Send at a fixed rate (requests/s) for `seconds` or until `stop` is set, whatever the answers take."""
    import aiohttp

    run = Run()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        tasks = []
        i = 0
        while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
            tasks.append(asyncio.create_task(_one(session, url, bodies[i % len(bodies)], i, t0, timeout)))
            i += 1
            next_at = t0 + i / rate
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        run.results = list(await asyncio.gather(*tasks))
        run.wall = time.perf_counter() - t0
    return run


async def get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
                try:
                    return resp.status, json.loads(raw)
                except ValueError:
                    return resp.status, raw.decode(errors="replace")
    except Exception as exc:
        return 0, f"{type(exc).__name__}: {exc}"


async def post(url: str, body: Any, timeout: float = 30.0, headers: dict | None = None) -> tuple[int, Any, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=json.dumps(body), timeout=aiohttp.ClientTimeout(total=timeout),
                                headers={"content-type": "application/json", **(headers or {})}) as resp:
            raw = await resp.read()
            try:
                decoded = json.loads(raw)
            except ValueError:
                decoded = raw.decode(errors="replace")
            return resp.status, decoded, dict(resp.headers)
