"""Runtime overhead: what the decision server adds per decision in front of an instant upstream.

    .venv/bin/python benchmarks/runtime_overhead.py [--requests 3000] [--quick] [--json out.json] [--profile]

Four processes on loopback: an *instant upstream* (answers every chat completion at once with a real scored
vLLM-format response, made by the stand-in for this config), the decision server (`arbiter-runtime serve`,
uvloop + httptools, schema validation on, audit to stdout -> /dev/null), the floor server (below), and this load
generator (raw HTTP/1.1 keep-alive connections, one per concurrent caller, so the client costs little).

For each concurrency (1, 16, 64) it measures:
  - direct: callers -> instant upstream (network + HTTP + the upstream's own time);
  - floor: callers -> the same server stack (uvicorn + uvloop + httptools + starlette) answering `{}` and doing
    nothing else: what any Python ASGI server costs here before it does any work;
  - runtime: callers -> decision server (V2 infer, one row) -> instant upstream;
  - added latency = runtime minus direct at the same percentile and concurrency;
  - server own time = the server's Server-Timing `total - upstream` (its work per decision, queueing included);
  - decisions/s through the runtime, and the server process's CPU time per decision (from /proc).
Prints a table and writes JSON (default benchmarks/results/runtime_overhead.json). `--profile` runs the server
under pyinstrument and writes the profile (HTML, or `--profile-renderer text`) next to the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

LABELS = ["approve", "deny", "review"]
CONFIG = {
    "model": "bench", "version": "v1", "labels": LABELS, "reasoningCodes": ["income_ok", "debt_high", "thin_file"],
    "steps": 3, "trajectoryMode": "scored", "confidenceThreshold": 0.0, "lowConfidencePolicy": "flag",
    "deadlineMs": 5000,
    "inputSchema": {
        "type": "object",
        "properties": {"amount": {"type": "number", "minimum": 0},
                       "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                       "income": {"type": "number"}, "history": {"type": "array", "items": {"type": "integer"},
                                                                 "maxItems": 24}},
        "required": ["amount", "country", "income"], "additionalProperties": False},
    "fallbackRules": [{"name": "default", "when": "true", "decision": "review", "reasoningCode": "thin_file"}],
    "upstream": {"servedModelName": "bench", "maxRetries": 0},
}


def documents(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        doc = {"amount": 100 + i * 7, "country": ["DE", "FR", "US", "PL"][i % 4], "income": 30000 + i * 13,
               "history": [(i * j) % 5 for j in range(12)]}
        out.append(json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                           "data": [json.dumps(doc)]}]}).encode())
    return out


# ---------------------------------------------------------------------------------------------- instant upstream
def serve_instant(port: int, canned_path: str) -> None:
    canned = Path(canned_path).read_bytes()
    ok = b"{}"

    class Conn(asyncio.Protocol):
        def connection_made(self, transport):
            self.t = transport
            self.buf = b""

        def data_received(self, data):
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end]
                m = re.search(rb"(?i)content-length:\s*(\d+)", head)
                length = int(m.group(1)) if m else 0
                if len(self.buf) < end + 4 + length:
                    return
                path = head.split(b" ", 2)[1]
                self.buf = self.buf[end + 4 + length:]
                body = canned if path.endswith(b"/chat/completions") else ok
                self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % len(body) + body)

    async def main():
        server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def serve_floor(port: int) -> None:
    """The same server stack doing nothing: uvicorn (uvloop, httptools) + starlette, read the body, answer {}."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request):
        await request.body()
        return Response(b"{}", media_type="application/json")

    app = Starlette(routes=[Route("/floor", echo, methods=["POST"]), Route("/health", echo, methods=["GET"])])
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning")


def canned_response(workdir: Path) -> Path:
    """One real scored response from the stand-in (regex-constrained, logprob_token_ids), reused for every call."""
    import httpx
    from arbiter_devenv.vllm_standin import StandinServer
    from arbiter_runtime.config import parse_config
    from arbiter_runtime.decide import ScoredMode, canonical_json, derive_seed
    from arbiter_runtime.tokens import LabelTokens

    standin = StandinServer(words=LABELS, served_model_name="bench").start()
    try:
        vocab = standin.state.tokenizer.get_vocab()
        cfg = parse_config(CONFIG)
        mode = ScoredMode(cfg, LabelTokens({x: vocab[x] for x in LABELS}, {}, "bench"))
        doc = {"amount": 1, "country": "DE", "income": 1}
        body = mode.request(canonical_json(doc), derive_seed(cfg, canonical_json(doc)))
        resp = httpx.post(standin.url + "/chat/completions", json=body, timeout=30)
        resp.raise_for_status()
        mode.parse(resp.json())  # it must be a response the runtime accepts
    finally:
        standin.stop()
    path = workdir / "canned.json"
    path.write_bytes(resp.content)
    (workdir / "request.json").write_text(json.dumps(body))
    return path


# ------------------------------------------------------------------------------------------------ load generator
async def _caller(port: int, path: str, bodies: list[bytes], count: int, offset: int, lat: list, own: list,
                  headers: bytes = b""):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n").encode() + headers
    try:
        for i in range(count):
            body = bodies[(offset + i) % len(bodies)]
            t0 = time.perf_counter()
            writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            header = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length:\s*(\d+)", header)
            payload = await reader.readexactly(int(m.group(1)))
            lat.append(time.perf_counter() - t0)
            if not header.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{path}: {header[:40]!r} {payload[:200]!r}")
            t = re.search(rb"(?i)server-timing:\s*upstream;dur=([\d.]+), total;dur=([\d.]+)", header)
            if t:
                own.append((float(t.group(2)) - float(t.group(1))) / 1000)
    finally:
        writer.close()


async def load(port: int, path: str, bodies: list[bytes], concurrency: int, total: int, headers: bytes = b""):
    """headers: more request header lines ("name: value\r\n" each), e.g. a context header."""
    lat: list[float] = []
    own: list[float] = []
    per = max(1, total // concurrency)
    t0 = time.perf_counter()
    await asyncio.gather(*(_caller(port, path, bodies, per, i * 7, lat, own, headers) for i in range(concurrency)))
    return lat, own, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), to report the server's CPU per decision."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def stop_all(procs: list[subprocess.Popen[bytes]], work: Path | str) -> None:
    """SIGTERM every server, give each 10 s to drain, kill what is left; remove the work folder."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)


def wait_http(port: int, path: str, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing ready on port {port}{path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None,
                   help="requests per concurrency level and path (default 3000; --quick: 200)")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--quick", action="store_true", help="CI smoke: few requests, checks that it completes")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "runtime_overhead.json"))
    p.add_argument("--profile", action="store_true",
                   help="run the server under pyinstrument (the profile is written next to the JSON)")
    p.add_argument("--profile-renderer", default="html", choices=["html", "text"])
    p.add_argument("--serve-instant", nargs=2, metavar=("PORT", "CANNED"), help=argparse.SUPPRESS)
    p.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return 0
    if args.serve_instant:
        serve_instant(int(args.serve_instant[0]), args.serve_instant[1])
        return 0
    if args.requests is None:
        args.requests = 200 if args.quick else 3000

    from arbiter_devenv.vllm_standin import free_port, write_model_dir

    work = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    canned = canned_response(work)
    model_dir = write_model_dir(work / "model", LABELS, "bench")
    up_port, rt_port, floor_port = free_port(), free_port(), free_port()
    cfg = dict(CONFIG, upstream=dict(CONFIG["upstream"], url=f"http://127.0.0.1:{up_port}/v1"))
    (work / "decision.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "runtime"))
    upstream = subprocess.Popen([sys.executable, __file__, "--serve-instant", str(up_port), str(canned)], env=env)
    server_cmd = [sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(work / "decision.json"),
                  "--port", str(rt_port), "--host", "127.0.0.1", "--model-dir", str(model_dir)]
    profile_html = Path(args.json).with_suffix(".profile." + ("html" if args.profile_renderer == "html" else "txt"))
    if args.profile:
        server_cmd = [sys.executable, "-m", "pyinstrument", "-r", args.profile_renderer, "-o", str(profile_html),
                      "-m", "arbiter_runtime", *server_cmd[3:]]
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    floor = subprocess.Popen([sys.executable, __file__, "--serve-floor", str(floor_port)], env=env)
    levels = [int(c) for c in args.concurrency.split(",")]
    results = []
    try:
        wait_http(up_port, "/health")
        wait_http(rt_port, "/v2/health/ready")
        wait_http(floor_port, "/health")
        bodies = documents(256)
        chat = [(work / "request.json").read_bytes()]
        infer = "/v2/models/bench/infer"
        asyncio.run(load(rt_port, infer, bodies, 8, 400))  # warm-up: connections, caches
        asyncio.run(load(up_port, "/v1/chat/completions", chat, 8, 400))
        for c in levels:
            total = max(args.requests, c * 20)
            d_lat, _, _ = asyncio.run(load(up_port, "/v1/chat/completions", chat, c, total))
            f_lat, _, f_elapsed = asyncio.run(load(floor_port, "/floor", bodies, c, total))
            cpu0 = cpu_seconds(server.pid)
            r_lat, own, elapsed = asyncio.run(load(rt_port, infer, bodies, c, total))
            cpu = cpu_seconds(server.pid) - cpu0
            row = {
                "concurrency": c, "requests": len(r_lat),
                "direct_p50_ms": pct(d_lat, 50) * 1e3, "direct_p99_ms": pct(d_lat, 99) * 1e3,
                "runtime_p50_ms": pct(r_lat, 50) * 1e3, "runtime_p99_ms": pct(r_lat, 99) * 1e3,
                "added_p50_ms": (pct(r_lat, 50) - pct(d_lat, 50)) * 1e3,
                "added_p99_ms": (pct(r_lat, 99) - pct(d_lat, 99)) * 1e3,
                "floor_p50_ms": pct(f_lat, 50) * 1e3, "floor_p99_ms": pct(f_lat, 99) * 1e3,
                "floor_requests_per_s": len(f_lat) / f_elapsed,
                "server_own_p50_ms": pct(own, 50) * 1e3, "server_own_p99_ms": pct(own, 99) * 1e3,
                "decisions_per_s": len(r_lat) / elapsed,
                "server_cpu_ms_per_decision": cpu / len(r_lat) * 1e3,
            }
            results.append(row)
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn stops cleanly; pyinstrument then writes its report
        try:
            server.wait(30 if args.profile else 10)
        except subprocess.TimeoutExpired:
            server.kill()
        for proc in (upstream, floor):
            proc.terminate()
            proc.wait(10)
    print(f"{'conc':>4} {'direct p50/p99 ms':>18} {'floor p50/p99 ms':>17} {'runtime p50/p99 ms':>19} "
          f"{'added p50/p99 ms':>17} "
          f"{'own p50/p99 ms':>15} {'decisions/s':>11} {'cpu ms/dec':>10}")
    for r in results:
        print(f"{r['concurrency']:>4} {r['direct_p50_ms']:>8.2f}/{r['direct_p99_ms']:<9.2f} "
              f"{r['floor_p50_ms']:>7.2f}/{r['floor_p99_ms']:<9.2f} "
              f"{r['runtime_p50_ms']:>8.2f}/{r['runtime_p99_ms']:<10.2f} {r['added_p50_ms']:>7.2f}/"
              f"{r['added_p99_ms']:<9.2f} {r['server_own_p50_ms']:>6.2f}/{r['server_own_p99_ms']:<8.2f} "
              f"{r['decisions_per_s']:>11.0f} {r['server_cpu_ms_per_decision']:>10.3f}")
    out = {"benchmark": "runtime_overhead", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "config": {"steps": CONFIG["steps"], "labels": len(LABELS), "schema_validation": True,
                      "requests_per_level": args.requests},
           "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}" + (f" and {profile_html}" if args.profile else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
