"""What a uvicorn access-log line costs the server that writes it: the reason the runtime's supervisor starts vLLM
with `--disable-uvicorn-access-log` (runtime/arbiter_runtime/supervisor.py).

    .venv/bin/python benchmarks/access_log.py [--requests 6000] [--rounds 2]

vLLM's API server is uvicorn on httptools and uvloop, as here. A bare ASGI app answers `{}`; 8 closed-loop clients
POST to it; the server process's CPU (from /proc) is divided by the requests, with the access log on (uvicorn's
default, vLLM's too) and off, alternating, its output going to a file as a container's stdout goes to a pipe. What
is left with the log off is uvicorn's own cost per request, the same in both; the difference is the log line's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from arbiter_devenv._procs import free_port

APP = '''
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})
'''


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, requests: int, clients: int) -> None:
    async with httpx.AsyncClient() as c:
        async def one(n: int) -> None:
            for _ in range(n):
                (await c.post(url, json={"a": 1})).raise_for_status()

        await asyncio.gather(*(one(requests // clients) for _ in range(clients)))


def measure(workdir: Path, access_log: bool, requests: int) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(workdir), "--port", str(port),
           "--http", "httptools", "--loop", "uvloop", "--log-level", "info"]
    if not access_log:
        cmd.append("--no-access-log")
    log = workdir / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=out)
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url, timeout=1)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
            asyncio.run(load(url, 500, 8))  # warm
            size0, cpu0 = log.stat().st_size, cpu_seconds(server.pid)
            asyncio.run(load(url, requests, 8))
            cpu, size = cpu_seconds(server.pid) - cpu0, log.stat().st_size - size0
        finally:
            server.terminate()
            server.wait(10)
    return {"access_log": access_log, "cpu_us_per_request": round(1e6 * cpu / requests, 1),
            "log_bytes_per_request": round(size / requests, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "app.py").write_text(APP)
        print(f"{'access log':>10} {'CPU us/request':>15} {'log bytes/request':>18}")
        for _ in range(args.rounds):
            for on in (True, False):
                r = measure(workdir, on, args.requests)
                print(f"{'on' if on else 'off':>10} {r['cpu_us_per_request']:>15} {r['log_bytes_per_request']:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
