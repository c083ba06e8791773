"""A hostile S3 endpoint: a raw HTTP/1.1 server that answers each request with what `answer` returns.

Written on raw asyncio streams (support.loopback_peer) so it can do what a real S3 never would: lie in
Content-Length, close mid-body, trickle or stall, send gigabytes, declare entities, redirect elsewhere. It records
every request (method, path, query, headers), counts connections and the body bytes it managed to send. A test peer:
it never ships.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, urlsplit
from xml.sax.saxutils import escape

from support.loopback_peer import LoopbackPeer

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass(frozen=True)
class S3Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=lambda: [("Content-Type", "application/xml")])
    content_length: int | None = None  # None: the body's real length; set it to lie
    repeat: int = 1  # the body sent this many times (a huge body without holding it)
    stall: float = 0.0  # seconds of silence after the head, before the body
    trickle: float = 0.0  # seconds between the body's pieces (sent 16 bytes at a time)
    close: bool = False  # close the connection after this answer
    chunked: bool = False  # Transfer-Encoding: chunked; `body` is sent as given, framing (or its lack) included


def listing_xml(keys: list[tuple[str, int]], *, prefix: str = "", truncated: bool = False, token: str | None = None,
                url_encoded: bool = True) -> bytes:
    """A ListObjectsV2 page as S3 writes it."""
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{S3_NS}"><Name>models</Name>'
             f"<Prefix>{prefix}</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>"
             f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
    if url_encoded:
        parts.append("<EncodingType>url</EncodingType>")
    if token is not None:
        parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
    for key, size in keys:
        shown = quote(key, safe="/") if url_encoded else escape(key)
        parts.append(f'<Contents><Key>{shown}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>'
                     f'<ETag>"{size:032x}"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>')
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def chunked(body: bytes, size: int = 100) -> bytes:
    """`body` in HTTP/1.1 chunked framing."""
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def error_xml(code: str, message: str = "refused") -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            "<RequestId>1</RequestId></Error>").encode()


class HostileS3(LoopbackPeer):
    name = "hostile-s3"
    ssl_context: ssl.SSLContext | None = None  # set before start() to serve HTTPS

    def __init__(self) -> None:
        super().__init__()
        self.answer: Callable[[S3Request], Answer] = lambda request: Answer(404, error_xml("NoSuchKey"))
        self.requests: list[S3Request] = []
        self.connections = 0
        self.bytes_sent = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self, answer: Callable[[S3Request], Answer]) -> None:
        self.answer, self.requests, self.connections, self.bytes_sent = answer, [], 0, 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await super()._handle(reader, writer)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        method, target, headers = await self._read_head(reader)
        split = urlsplit(target)
        request = S3Request(method, split.path, dict(parse_qsl(split.query, keep_blank_values=True)), headers)
        self.requests.append(request)
        return await self._send(self.answer(request), writer)

    async def _send(self, answer: Answer, writer: asyncio.StreamWriter) -> bool:
        """Write one answer; False when the connection is to be closed."""
        real = len(answer.body) * answer.repeat
        length = real if answer.content_length is None else answer.content_length
        framing = "Transfer-Encoding: chunked" if answer.chunked else f"Content-Length: {length}"
        head = [f"HTTP/1.1 {answer.status} Hostile", *(f"{k}: {v}" for k, v in answer.headers), framing, "", ""]
        writer.write("\r\n".join(head).encode("latin-1"))
        await writer.drain()
        if answer.stall:
            await asyncio.sleep(answer.stall)
        for _ in range(answer.repeat):
            pieces = ([answer.body[i:i + 16] for i in range(0, len(answer.body), 16)] if answer.trickle
                      else [answer.body])
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                self.bytes_sent += len(piece)
                if answer.trickle:
                    await asyncio.sleep(answer.trickle)
        return not answer.close and length == real and not answer.chunked


HTML_502 = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>\n"


class S3FaultProxy(LoopbackPeer):
    """A real S3 (the devenv's S3 server) behind a proxy that breaks what `fault(request)` names, per request:

        pass         forward, answer what S3 answered
        ack_lost     forward (S3 stores it), then answer 500 InternalError: the acknowledgement is lost
        reset_after  forward (S3 stores it), then reset the connection instead of answering
        reset        reset the connection; S3 never sees the request
        slow_down    503 SlowDown; S3 never sees the request
        forbidden    403 AccessDenied (a role without that permission); S3 never sees the request
        html_502     502 with an HTML page, not S3's XML (a load balancer's answer); S3 never sees the request
        html_after   forward (S3 stores it), then 502 with an HTML page
        cut_answer   forward, then S3's answer with its body cut in half (its headers say the whole length)

    Requests are forwarded byte for byte (the Host header and the path as signed), so SigV4 signatures hold.
    `throttle_for(seconds)` answers slow_down to everything for that long. `seen` lists (request, fault).
    """

    name = "s3-fault-proxy"

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target.rstrip("/")
        self.fault: Callable[[S3Request], str] = lambda request: "pass"
        self.seen: list[tuple[S3Request, str]] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def throttle_for(self, seconds: float) -> None:
        import time

        until = time.monotonic() + seconds
        self.fault = lambda request: "slow_down" if time.monotonic() < until else "pass"

    def faults(self, name: str) -> int:
        return sum(1 for _, fault in self.seen if fault == name)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        method, target, headers = await self._read_head(reader)
        if "chunked" in headers.get("transfer-encoding", ""):
            raise ValueError("chunked request bodies are not forwarded")  # boto3 over http sends Content-Length
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        split = urlsplit(target)
        request = S3Request(method, split.path, dict(parse_qsl(split.query, keep_blank_values=True)), headers)
        fault = self.fault(request)
        self.seen.append((request, fault))
        if fault == "reset":
            await self._break_connection(writer, "reset")
            return False
        if fault == "html_502":
            await self._answer(writer, 502, [("Content-Type", "text/html")], HTML_502, head=method == "HEAD")
            return True
        if fault in ("slow_down", "forbidden"):
            status, code = (503, "SlowDown") if fault == "slow_down" else (403, "AccessDenied")
            await self._answer(writer, status, [], error_xml(code), head=method == "HEAD")
            return True
        status, answer_headers, content = await self._forward(method, target, headers, body)
        if fault == "reset_after":
            await self._break_connection(writer, "reset")
            return False
        if fault == "ack_lost":
            status, answer_headers, content = 500, [], error_xml("InternalError", "We encountered an internal error.")
        if fault == "html_after":
            status, answer_headers, content = 502, [("Content-Type", "text/html")], HTML_502
        if fault == "cut_answer" and content and method != "HEAD":
            await self._answer(writer, status, answer_headers, content, cut=len(content) // 2)
            return False
        await self._answer(writer, status, answer_headers, content, head=method == "HEAD")
        return True

    async def _forward(self, method: str, target: str, headers: dict[str, str],
                       body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        import yarl

        assert self._session is not None
        skip = {"content-length", "expect", "connection", "transfer-encoding"}
        async with self._session.request(method, yarl.URL(self.target + target, encoded=True),
                                         headers={k: v for k, v in headers.items() if k not in skip},
                                         data=body if body or method in ("PUT", "POST") else None,
                                         skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
                                         allow_redirects=False, auto_decompress=False) as resp:
            content = await resp.read()
            return resp.status, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers], content

    async def _answer(self, writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]],
                      body: bytes, head: bool = False, cut: int | None = None) -> None:
        """S3's answer (or the fault's); `cut`: only that many bytes of the body, under the whole one's length."""
        keep = [(k, v) for k, v in headers
                if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length")]
        if not head:
            keep.append(("Content-Length", str(len(body))))
        if not any(k.lower() == "content-type" for k, _ in keep):
            keep.append(("Content-Type", "application/xml"))
        lines = [f"HTTP/1.1 {status} Proxied", *(f"{k}: {v}" for k, v in keep), "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + (b"" if head else body[:cut]))
        await writer.drain()
