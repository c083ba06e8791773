"""A hostile shadow candidate: a raw HTTP/1.1 server that answers mirrored V2 infer requests the ways a broken or
malicious candidate runtime could. A test peer: it never ships.

The behaviour of each request is picked by its V2 `id` (`plan[id]`, else `default`), so a test knows what every
mirrored request met even when they arrive concurrently. The well-formed answers are real: the peer forwards the
request to `truth_url` (a real decision server, e.g. the stable itself, with the shadow header so it is not mirrored
again) and answers with that server's decisions, as they are ("agree") or altered.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from support.loopback_peer import LoopbackPeer

# behaviour -> what the stable must record: "compared" (agree: True/False/None = per row) or "error"
EXPECTED = {
    "agree": ("compared", True),
    "slow": ("compared", True),
    "disagree": ("compared", False),
    "unknown_label": ("compared", False),
    "surrogate_label": ("compared", False),
    "non_string": ("error", None),
    "wrong_rows": ("error", None),
    "no_outputs": ("error", None),
    "http_500": ("error", None),
    "http_503": ("error", None),
    "http_404": ("error", None),
    "garbage": ("error", None),
    "huge": ("error", None),
    "huge_declared": ("error", None),
    "endless": ("error", None),
    "hang": ("error", None),
    "reset": ("error", None),
    "close": ("error", None),
    "truncated": ("error", None),
    "bad_status_line": ("error", None),
}
BEHAVIOURS = tuple(EXPECTED)


class HostileCandidate(LoopbackPeer):
    name = "hostile-candidate"

    def __init__(self, truth_url: str, labels: list[str], model: str = "credit", slow_s: float = 0.2,
                 hang_s: float = 3600.0):
        self.truth_url = truth_url.rstrip("/")
        self.labels = list(labels)
        self.model = model
        self.slow_s = slow_s
        self.hang_s = hang_s
        self.plan: dict[str, str] = {}
        self.default = "agree"
        self.unknown_label = "maybe-later"
        self.headers_seen: list[dict[str, str]] = []  # the last requests' headers (bounded)
        self.requests = 0
        self.endless_cut: list[float] = []  # per "endless" answer: seconds from its first byte until the stable hung up
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        _, _, headers, body = await self._read_request(reader)
        self.requests += 1
        self.headers_seen = ([*self.headers_seen, headers])[-50:]
        return await self._respond(body, writer)

    async def _send(self, writer, status: int, body: bytes, length: int | None = None) -> None:
        head = (f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body) if length is None else length}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()

    async def _endless(self, writer: asyncio.StreamWriter, answer: bytes) -> None:
        """The right answer, chunked, then whitespace (still JSON, were it ever to end) until the stable hangs up."""
        clock = asyncio.get_running_loop().time
        t0 = clock()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        pad = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        try:
            writer.write(b"%x\r\n%s\r\n" % (len(answer), answer))
            while clock() - t0 < self.hang_s:
                writer.write(pad)
                await writer.drain()
        except ConnectionError:
            self.endless_cut.append(clock() - t0)

    async def _truth(self, body: bytes) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.post(f"{self.truth_url}/v2/models/{self.model}/infer", data=body,
                                      headers={"content-type": "application/json",
                                               "x-arbiter-shadow": "hostile-candidate"}) as resp:
            return json.loads(await resp.read())

    async def _respond(self, body: bytes, writer) -> bool:
        try:
            request_id = json.loads(body).get("id")
        except ValueError:
            request_id = None
        behaviour = self.plan.get(request_id, self.default)
        if behaviour == "hang":
            await asyncio.sleep(self.hang_s)
            return False
        if await self._break_connection(writer, behaviour):
            return False
        if behaviour.startswith("http_"):
            await self._send(writer, int(behaviour[5:]), b'{"error": "candidate failure"}')
            return True
        if behaviour == "garbage":
            await self._send(writer, 200, b'{"outputs": [{"name": "decision", "data": ["approve"')
            return True
        if behaviour == "huge":  # no length: read until the close, which never comes before 2 MiB
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
            chunk = b" " * 65536
            for _ in range(32):
                writer.write(chunk)
                await writer.drain()
            return False
        if behaviour == "huge_declared":
            await self._send(writer, 200, b"{}", length=512 * 1024 * 1024)
            return False
        answer = await self._truth(body)
        if behaviour == "endless":
            await self._endless(writer, json.dumps(answer).encode())
            return False
        outputs = {o["name"]: o for o in answer["outputs"]}
        decisions = outputs["decision"]["data"]
        if behaviour == "slow":
            await asyncio.sleep(self.slow_s)
        elif behaviour == "disagree":
            decisions[:] = [self.labels[(self.labels.index(d) + 1) % len(self.labels)] for d in decisions]
        elif behaviour == "unknown_label":
            decisions[:] = [self.unknown_label for _ in decisions]
        elif behaviour == "surrogate_label":  # a lone surrogate escape: valid JSON text, not valid Unicode
            decisions[:] = ["\ud800" + d for d in decisions]
        elif behaviour == "non_string":
            decisions[0] = {"label": decisions[0]}
        elif behaviour == "wrong_rows":
            decisions.append(decisions[0])
        elif behaviour == "no_outputs":
            answer = {"model_name": self.model, "outputs": None}
        data = json.dumps(answer).encode()
        if behaviour == "truncated":
            await self._send(writer, 200, data[: len(data) // 2], length=len(data))
            return False
        await self._send(writer, 200, data)
        return True
