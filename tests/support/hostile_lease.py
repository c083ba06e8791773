"""A hostile apiserver for the leader election: a raw HTTP/1.1 server on loopback serving `coordination.k8s.io/v1`
Leases (GET, POST, PUT) honestly, as the apiserver does (404 for a missing Lease, 409 for a create of an existing one
or an update naming another resourceVersion), or each request answered by the next behaviour of `script`:

- ("honest",)
- ("status", code, body): that status and body, nothing written
- ("ok", body): a GET answered 200 with that body (a wrong-shaped Lease, garbage); a write done honestly and then
  answered 200 with that body (the Lease written, its answer unreadable)
- ("hang",): no answer at all; ("hang_after_headers",): headers, then silence
- ("reset",), ("close",), ("bad_status_line",): the connection broken

A test peer: it never ships.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from kubernetes import client as k8s

from support.loopback_peer import LoopbackPeer

Behaviour = tuple[Any, ...]
PATH_PREFIX = "/apis/coordination.k8s.io/v1/namespaces/"


def _status(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                       "message": message, "code": code}).encode()


class HostileLeaseServer(LoopbackPeer):
    name = "hostile-lease-server"

    def __init__(self, hang_s: float = 2.0) -> None:
        self.hang_s = hang_s
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> the Lease as stored
        self.rv = 1
        self.script: list[Behaviour] = []
        self.requests: list[tuple[float, str, str]] = []  # (time.monotonic(), method, path) as received
        self._lock = threading.Lock()
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def configuration(self) -> k8s.Configuration:
        return k8s.Configuration(host=self.url)

    # -- what the test drives ------------------------------------------------------------------------------------------
    def holder(self, namespace: str, name: str) -> Any:
        with self._lock:
            spec = (self.leases.get((namespace, name)) or {}).get("spec")
        return spec.get("holderIdentity") if isinstance(spec, dict) else None

    def write(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """Another writer's update of the Lease (a third replica's), committed as the apiserver would."""
        with self._lock:
            self.rv += 1
            self.leases[(namespace, name)] = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv)},
                "spec": dict(spec)}

    def writes_since(self, since: float) -> list[tuple[float, str, str]]:
        with self._lock:
            return [r for r in self.requests if r[0] >= since and r[1] != "GET"]

    # -- the honest apiserver ------------------------------------------------------------------------------------------
    def _honest(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        parts = path.split("?")[0][len(PATH_PREFIX):].split("/") if path.startswith(PATH_PREFIX) else []
        if len(parts) not in (2, 3) or parts[1] != "leases":
            return 404, _status(404, "NotFound", f"no such path {path}")
        namespace, name = parts[0], parts[2] if len(parts) == 3 else None
        if method == "GET" and name:
            found = self.leases.get((namespace, name))
            return (200, json.dumps(found).encode()) if found else (404, _status(404, "NotFound", "no Lease"))
        try:
            doc = json.loads(body)
            meta, spec = doc["metadata"], doc["spec"]
            name = name or meta["name"]
            assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(name, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            return 400, _status(400, "BadRequest", "not a Lease")
        key = (namespace, name)
        if method == "POST" and key in self.leases:
            return 409, _status(409, "AlreadyExists", "the Lease exists")
        if method == "PUT":
            if key not in self.leases:
                return 404, _status(404, "NotFound", "no Lease")
            if meta.get("resourceVersion") != self.leases[key]["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", "the object has been modified")
        if method not in ("POST", "PUT"):
            return 405, _status(405, "MethodNotAllowed", method)
        self.rv += 1
        stored = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                  "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv)}, "spec": spec}
        self.leases[key] = stored
        return (201 if method == "POST" else 200), json.dumps(stored).encode()

    # -- the wire ------------------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, target, _headers, body = await self._read_request(reader)
                with self._lock:
                    self.requests.append((time.monotonic(), method, target))
                    how = self.script.pop(0) if self.script else ("honest",)
                    if how[0] == "honest" or (how[0] == "ok" and method != "GET"):
                        status, payload = self._honest(method, target, body)
                        if how[0] == "ok" and 200 <= status < 300:
                            payload = how[1]
                    elif how[0] in ("status", "ok"):
                        status, payload = (how[1], how[2]) if how[0] == "status" else (200, how[1])
                    else:
                        status, payload = 200, b""
                if await self._break_connection(writer, how[0]):
                    break
                if how[0] == "hang":
                    await asyncio.sleep(self.hang_s)
                    break
                writer.write(f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(payload)}\r\n\r\n".encode())
                if how[0] == "hang_after_headers":
                    await writer.drain()
                    await asyncio.sleep(self.hang_s)
                    break
                writer.write(payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError,
                asyncio.CancelledError):
            pass  # the client went away, or the peer is stopping
        finally:
            writer.close()
