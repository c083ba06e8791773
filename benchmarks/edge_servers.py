"""HTTP servers for the decision server's edge: what each costs per request, answering `{}` and doing nothing else.

    .venv/bin/python benchmarks/edge_servers.py [--requests 3000] [--concurrency 1,16,64] [--servers ...]

The same Starlette app (read the body, answer `{}`) behind each server, one process each, one at a time, loaded by
runtime_overhead.py's generator (one raw keep-alive HTTP/1.1 connection per concurrent caller, closed loop):
  - uvicorn: uvicorn + uvloop + httptools, as the decision server ran before its edge limits;
  - guarded: the same with the decision server's protocol (arbiter_runtime/edge.py: read deadlines, head limit,
    connection cap), as `arbiter-runtime serve` runs it;
  - granian: granian (Rust, one worker, uvloop), header read timeout and buffer limit built in;
  - hypercorn: hypercorn (h11, uvloop), read timeout and incomplete-event limit built in.
granian and hypercorn are not dependencies: the servers not installed are skipped (install them to compare).
Prints p50/p99 latency, requests/s and the server's CPU per request (from /proc); writes JSON (default
benchmarks/results/edge_servers.json).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))

from runtime_overhead import cpu_seconds, documents, load, pct, wait_http  # noqa: E402

SERVERS = ("uvicorn", "guarded", "granian", "hypercorn")


def floor_app():
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request):
        await request.body()
        return Response(b"{}", media_type="application/json")

    return Starlette(routes=[Route("/floor", echo, methods=["POST"]), Route("/health", echo, methods=["GET"])])


def serve(kind: str, port: int) -> None:
    import uvicorn

    http = "httptools"
    if kind == "guarded":
        from arbiter_runtime.edge import EdgeLimits, guarded_protocol

        http = guarded_protocol(EdgeLimits())  # type: ignore[assignment]
    uvicorn.run(floor_app(), host="127.0.0.1", port=port, loop="uvloop", http=http, ws="none", access_log=False,
                log_level="warning")


def command(kind: str, port: int) -> list[str] | None:
    if kind in ("uvicorn", "guarded"):
        return [sys.executable, __file__, "--serve", kind, str(port)]
    if importlib.util.find_spec(kind) is None:
        return None
    if kind == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-log", "--factory",
                "--working-dir", str(HERE), "edge_servers:floor_app"]
    # hypercorn closes a keep-alive connection after 1,000 requests unless told otherwise (a config-file key).
    conf = Path(tempfile.gettempdir()) / "edge_servers_hypercorn.toml"
    conf.write_text("keep_alive_max_requests = 100000000\n")
    return [sys.executable, "-m", "hypercorn", "--bind", f"127.0.0.1:{port}", "--worker-class", "uvloop",
            "--workers", "1", "--config", str(conf), "edge_servers:floor_app()"]


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants (granian and hypercorn serve from a worker process)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(cpu_seconds(p) for p in tree)


def measure(kind: str, levels: list[int], requests: int) -> list[dict] | None:
    from arbiter_devenv.vllm_standin import free_port

    port = free_port()
    cmd = command(kind, port)
    if cmd is None:
        print(f"{kind}: not installed, skipped")
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent / "runtime"),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.DEVNULL)
    rows = []
    try:
        wait_http(port, "/health")
        bodies = documents(64)
        asyncio.run(load(port, "/floor", bodies, 8, 400))
        for c in levels:
            total = max(requests, c * 20)
            cpu0 = tree_cpu(proc.pid)
            lat, _, elapsed = asyncio.run(load(port, "/floor", bodies, c, total))
            cpu = tree_cpu(proc.pid) - cpu0
            rows.append({"server": kind, "concurrency": c, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                         "requests_per_s": len(lat) / elapsed, "cpu_ms_per_request": cpu / len(lat) * 1e3})
    finally:
        proc.terminate()
        proc.wait(10)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--rounds", type=int, default=1, help="measure every server this many times, interleaved")
    p.add_argument("--json", default=str(HERE / "results" / "edge_servers.json"))
    p.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    results = []
    for _ in range(args.rounds):
        for kind in args.servers.split(","):
            results += measure(kind, levels, args.requests) or []
    print(f"{'server':>10} {'conc':>4} {'p50/p99 ms':>16} {'req/s':>7} {'cpu ms/req':>10}")
    for r in results:
        print(f"{r['server']:>10} {r['concurrency']:>4} {r['p50_ms']:>7.2f}/{r['p99_ms']:<8.2f} "
              f"{r['requests_per_s']:>7.0f} {r['cpu_ms_per_request']:>10.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"benchmark": "edge_servers", "results": results,
                                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
