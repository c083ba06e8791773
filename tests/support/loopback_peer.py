"""A raw asyncio HTTP peer on loopback, in a thread with its own event loop: the lifecycle the hostile test peers
(hostile_upstream, hostile_candidate, hostile_s3, hostile_apiserver) share. A subclass writes `_exchange` (one
request) or `_handle` (one connection), which read and answer raw bytes, so it can misbehave below what an HTTP
framework would allow."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading

import aiohttp
from arbiter_devenv.vllm_standin import free_port


class LoopbackPeer:
    name = "loopback-peer"
    read_limit = 1 << 22  # the largest request head or line the peer reads
    ssl_context: ssl.SSLContext | None = None  # set: the peer speaks TLS

    def __init__(self) -> None:
        self.port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._session: aiohttp.ClientSession | None = None  # for the peers that forward to a real server

    def start(self):  # type: ignore[no-untyped-def]
        self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError(f"{self.name} did not start")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._session = aiohttp.ClientSession()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, limit=self.read_limit,
                                            ssl=self.ssl_context)
        self._started.set()
        try:
            async with server:
                await server.serve_forever()
        except asyncio.CancelledError:
            pass
        finally:
            await self._session.close()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
        self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: `_exchange` after `_exchange` until one says to close, or the client hangs up or sends
        what the peer cannot read. A peer that misbehaves below one request at a time overrides this instead."""
        try:
            while await self._exchange(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it (or not); False closes the connection."""
        raise NotImplementedError

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
        """The next request on a keep-alive connection: method, target, headers (lower-case names) and body (by
        Content-Length). Raises IncompleteReadError when the client hangs up, ValueError on a malformed head."""
        method, target, headers = await LoopbackPeer._read_head(reader)
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        return method, target, headers, body

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
        """The next request's head: method, target and headers (lower-case names); the body is left unread."""
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        return method, target, headers

    @staticmethod
    async def _break_connection(writer: asyncio.StreamWriter, how: str) -> bool:
        """The connection-level misbehaviours every hostile peer shares: `reset` (RST instead of FIN), `close` or
        `close_no_response` (FIN, no answer), `bad_status_line`. True when `how` is one of them; the caller then
        closes the connection without answering."""
        if how in ("reset", "close", "close_no_response"):
            if how == "reset":
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return True
        if how == "bad_status_line":
            writer.write(b"HTTP/1.1 twohundred\r\nwhat is this\r\n\r\n")
            await writer.drain()
            return True
        return False
