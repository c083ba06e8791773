"""The decision server as a process, for tests of its network edge, and an upstream that floods its answers.

    server = ServeProc(workdir, upstream_url, env={"ARBITER_HEADER_TIMEOUT_S": "1"}, nofile=1024).start()
    server.port, server.url, server.log(), server.peak_rss_kib(), server.rss_kib(); server.terminate(20); server.stop()
    flood = FloodUpstream(standin.url).start(); flood.mode = "padded" | "chunked" | "pass"; flood.stop()

`ServeProc` runs `python -m arbiter_runtime serve` with its descriptor limit set (RLIMIT_NOFILE, soft and hard, as
`ulimit -n` in a container would), its log in `workdir/runtime.log` and its audit (stdout) in `workdir/audit.jsonl`
or where `stdout` says (a pipe nobody reads, say).
`FloodUpstream` forwards everything to a stand-in but, in mode "padded", answers a chat completion with a valid
answer padded to `padded_bytes` (Content-Length declared, written 1 MiB at a time), in mode "chunked" with a chunked
answer that never ends; it generates the bytes as it writes them, so the test process holds none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from arbiter_devenv.vllm_standin import free_port

from support.hostile_upstream import HostileUpstream
from support.paths import REPO
from support.runtime_procs import decision_config


class ServeProc:
    def __init__(self, workdir: Path, upstream_url: str, env: dict[str, str] | None = None,
                 nofile: int | None = None, stdout: Any = None, **config: Any):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env or {}
        self.nofile = nofile
        self.stdout = stdout
        self.config = decision_config("credit", "v1", upstream_url, **config)
        self.proc: subprocess.Popen | None = None

    def _limit(self) -> None:  # in the child, before exec
        if self.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def start(self, timeout: float = 60) -> ServeProc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "decision.json").write_text(json.dumps(self.config))
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env,
                   PYTHONPATH=os.pathsep.join([str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(self.workdir / "decision.json"),
             "--host", "127.0.0.1", "--port", str(self.port)], env=env, preexec_fn=self._limit,
            stdout=self.stdout or open(self.workdir / "audit.jsonl", "ab"),
            stderr=open(self.workdir / "runtime.log", "ab"))
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"decision server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"decision server not ready:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM, as the kubelet sends it: the exit code and the seconds the shutdown took."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.terminate()
        rc = self.proc.wait(timeout)
        return rc, time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        return (self.workdir / "runtime.log").read_text(errors="replace")

    def _status_kib(self, key: str) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def peak_rss_kib(self) -> int:
        return self._status_kib("VmHWM")

    def rss_kib(self) -> int:
        return self._status_kib("VmRSS")

    def decide(self, document: Any, timeout: float = 30) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(self.url + "/v1/decisions", data=json.dumps(document).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


MIB = 1 << 20


class FloodUpstream(HostileUpstream):
    name = "flood-upstream"

    def __init__(self, standin_url: str, padded_bytes: int = 300 * 1000 * 1000):
        super().__init__(standin_url)
        self.mode = "pass"
        self.padded_bytes = padded_bytes
        self.sent = 0  # bytes of flood written, over all answers

    async def _respond(self, method: str, path: str, body: bytes, writer) -> bool:
        if path != "/v1/chat/completions" or self.mode == "pass":
            return await super()._respond(method, path, body, writer)
        _status, content = await self._proxy(method, path, body)
        answer = content.rstrip()[:-1] + b', "padding": "'  # a valid answer, with a string as long as it takes
        try:
            if self.mode == "padded":
                tail = b'"}'
                size = len(answer) + self.padded_bytes + len(tail)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % size + answer)
                left = self.padded_bytes
                while left > 0:
                    n = min(MIB, left)
                    writer.write(b"x" * n)
                    await writer.drain()
                    left -= n
                    self.sent += n
                writer.write(tail)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
                             b"\r\n\r\n%x\r\n%s\r\n" % (len(answer), answer))
                chunk = b"%x\r\n%s\r\n" % (MIB, b"x" * MIB)
                while True:
                    writer.write(chunk)
                    await writer.drain()
                    self.sent += MIB
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return False
