"""The server's network edge: read deadlines, a request-head size limit and a connection cap, in the HTTP protocol.

uvicorn's httptools protocol reads a request head and body for as long as the client takes and buffers a head of
any size, and it accepts connections until the process runs out of file descriptors; then its accept fails and the
kubelet's liveness probe with it. A proxy in front may not be there, so the limits live here, in a subclass of that
protocol (one class per server, made by `guarded_protocol`):

- a request's head (request line + headers) must arrive within `header_timeout_s` of its first byte (of the
  connection, for the first request); its body within `body_timeout_s` of the head. Late: 408 and the connection
  closes (slowloris);
- a head larger than `max_header_bytes`: 431, the connection closes; at most that plus one read (256 KiB) is held;
- at most `connection_cap()` connections: one over it closes the connection that has waited longest for a request's
  head or body (an idle keep-alive connection, a slow sender); only a server whose every connection has a request in
  the decision path refuses the new one. The cap stays below the descriptor limit, so accept never fails and a
  probe's fresh connection is always read.

The deadlines are checked by one sweep per server, a few times a deadline, over connections kept in the order
they started waiting: per request the cost is two dictionary moves, not two timers.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("arbiter.runtime.edge")

# Descriptors kept for everything that is not a client connection: the upstream pool (upstream.py's
# UPSTREAM_MAX_CONNECTIONS is added by the caller), logs, the audit sinks, S3, the listening socket.
FD_RESERVE = 64


EXTENSION = "arbiter.edge"  # scope["extensions"][EXTENSION]["arrived"]: time.perf_counter() when the head was read


class EdgeConfigError(ValueError):
    pass


@dataclass(frozen=True)
class EdgeLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_connections: int = 0  # 0: as many as the descriptor limit allows

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EdgeLimits:
        """ARBITER_HEADER_TIMEOUT_S, ARBITER_BODY_TIMEOUT_S, ARBITER_MAX_HEADER_BYTES, ARBITER_MAX_CONNECTIONS."""
        d = cls()

        def num(name: str, default: float, kind: type, least: float) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise EdgeConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None
            if value < least:
                raise EdgeConfigError(f"{name}={raw!r}: at least {least}")
            return value

        return cls(header_timeout_s=num("ARBITER_HEADER_TIMEOUT_S", d.header_timeout_s, float, 0.05),
                   body_timeout_s=num("ARBITER_BODY_TIMEOUT_S", d.body_timeout_s, float, 0.05),
                   max_header_bytes=num("ARBITER_MAX_HEADER_BYTES", d.max_header_bytes, int, 1024),
                   max_connections=num("ARBITER_MAX_CONNECTIONS", d.max_connections, int, 0))

    def connection_cap(self, reserved_fds: int) -> int:
        """The connection cap: ARBITER_MAX_CONNECTIONS, at most the descriptor limit less what is reserved."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = max(16, soft - reserved_fds - FD_RESERVE) if soft != resource.RLIM_INFINITY else 1 << 20
        return min(self.max_connections, room) if self.max_connections else room


def raise_fd_limit() -> int:
    """Lift the soft descriptor limit to the hard one (as Go's runtime does): the default soft 1024 is a
    leftover of select(); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class HeadTooLarge(Exception):
    pass


class _Edge:
    """The state one server's connections share: who waits for a head or a body since when, and the sweep."""

    def __init__(self, limits: EdgeLimits, cap: int):
        self.limits = limits
        self.cap = cap
        self.heads: OrderedDict[Any, float] = OrderedDict()
        self.bodies: OrderedDict[Any, float] = OrderedDict()
        self.sweeper: asyncio.Task[None] | None = None
        self.tick = min(max(min(limits.header_timeout_s, limits.body_timeout_s) / 10, 0.02), 1.0)

    def ensure_sweeping(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = loop.create_task(self._sweep(), name="edge-sweep")

    async def _sweep(self) -> None:
        while self.heads or self.bodies:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            for waiting, limit, what in ((self.heads, self.limits.header_timeout_s, "request head"),
                                         (self.bodies, self.limits.body_timeout_s, "request body")):
                while waiting:
                    conn, since = next(iter(waiting.items()))
                    if now - since < limit:
                        break
                    waiting.pop(conn, None)
                    try:
                        conn.expire(f"{what} not received within {limit:g} s")
                    except Exception:  # one connection's failure must not end the sweep for all the others
                        log.exception("closing a late connection failed")

    def shed(self, newcomer: Any) -> None:
        """One connection over the cap: close the one that has waited longest, or the newcomer if none waits."""
        victim, oldest = newcomer, float("inf")
        for waiting in (self.heads, self.bodies):
            for conn, since in waiting.items():  # the first is the one waiting longest
                if conn is not newcomer and since < oldest:
                    victim, oldest = conn, since
                break
        log.debug("connection cap %d reached: closing the connection waiting longest", self.cap)
        victim.drop()


def _reply(transport: asyncio.Transport, status: int, reason: str, message: str) -> None:
    body = (message + "\n").encode()
    transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n%s" % (status, reason.encode(), len(body), body))
    transport.close()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HttpToolsProtocol with the edge's limits: per-connection deadlines for the head and the body, a
    head size bound, and a connection cap. `guarded_protocol` makes one subclass per server, bound to its _Edge."""

    edge: _Edge  # the server's shared state, set by guarded_protocol (as are cap and max_head)
    cap = 0  # the connection cap of the server the class was made for
    _head_bytes = 0  # bytes received while the head is incomplete
    _parsed = 0  # the head's bytes as the parser reported them
    _in_head = True
    _in_body = False  # the head is read, the body is not all read yet
    _idle = False  # between requests on keep-alive
    max_head = 0  # the largest request head in bytes: the edge's limits.max_header_bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.edge.heads[self] = time.monotonic()
        self.edge.ensure_sweeping(self.loop)
        if len(self.connections) > self.edge.cap:
            self.edge.shed(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def _forget(self) -> None:
        self.edge.heads.pop(self, None)
        self.edge.bodies.pop(self, None)

    def drop(self) -> None:
        self._forget()
        self.transport.close()

    def expire(self, message: str) -> None:
        log.debug("closing a connection from %s: %s", self.client, message)
        self._forget()
        cycle = self.cycle
        # The status line goes out only where no answer is: not into one on its way out, and not after the
        # answer to a request whose body is still coming in (a 413 sent early).
        answered = cycle is not None and cycle.response_started and (self._in_body or not cycle.response_complete)
        if answered:
            self.transport.close()
        else:
            _reply(self.transport, 408, "Request Timeout", message)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, plus the head accounting: a head that grows past the limit before it is complete is
        # refused as soon as it does, so at most the limit plus one read is ever held for it.
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # no WebSocket routes: uvicorn's answer to an upgrade
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, HeadTooLarge):  # raised by _count in a parser callback
                self._too_large()
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_bytes > self.max_head and not self.transport.is_closing():
            self._too_large()

    def _too_large(self) -> None:
        log.debug("refusing a request head over %d bytes from %s", self.max_head, self.client)
        self._forget()
        _reply(self.transport, 431, "Request Header Fields Too Large",
               f"request head larger than {self.max_head} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._parsed, self._in_head = 0, True
        if self._idle or self not in self.edge.heads:
            # After a keep-alive pause (or pipelined behind a request) the head's deadline counts from its first
            # byte; a connection's first head is timed from the connection.
            self._idle = False
            self.edge.heads.pop(self, None)
            self.edge.heads[self] = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._parsed += n
        if self._parsed > self.max_head:
            raise HeadTooLarge

    def on_headers_complete(self) -> None:
        # The request's arrival, for its deadline (server.py): the head is read, the handler may only run after
        # the other requests of a burst, and that wait is the server's, not the caller's.
        self.scope["extensions"] = {EXTENSION: {"arrived": time.perf_counter()}}
        self._in_head, self._in_body, self._head_bytes = False, True, 0
        self.edge.heads.pop(self, None)
        self.edge.bodies[self] = time.monotonic()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.edge.bodies.pop(self, None)
        self._in_body = False
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._become_idle()  # answered before its body was all read (a 413): idle from now on

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._in_head and not self._in_body and self.cycle.response_complete:
            self._become_idle()  # not while a pipelined request or the rest of this body is still read

    def _become_idle(self) -> None:
        # Idle on keep-alive: shed first when the cap is reached; uvicorn's keep-alive timeout closes it before
        # the head's deadline would.
        if not self.transport.is_closing():
            self._in_head = self._idle = True
            self.edge.heads[self] = time.monotonic()


def guarded_protocol(limits: EdgeLimits, reserved_fds: int = 0) -> type[GuardedProtocol]:
    """A GuardedProtocol class enforcing `limits`, for uvicorn.Config(http=...); one call per server."""
    edge = _Edge(limits, limits.connection_cap(reserved_fds))
    return type("GuardedProtocol", (GuardedProtocol,),
                {"edge": edge, "cap": edge.cap, "max_head": limits.max_header_bytes})


def arrived(scope: Mapping[str, Any]) -> float:
    """When the request's head was read (time.perf_counter()); now under a server without the edge protocol."""
    return ((scope.get("extensions") or {}).get(EXTENSION) or {}).get("arrived") or time.perf_counter()
