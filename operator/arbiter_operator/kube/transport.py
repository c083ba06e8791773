"""The operator's requests to the apiserver on its event loop, over aiohttp: the watch streams' session and the
transport of RestKubeClient's requests, the leader Lease's included.

Why: the reconcile's writes went through the kubernetes package's ApiClient (its pure-Python HTTP stack, whose
headers are parsed by the email package), and that was the largest share of the operator's CPU at fleet scale;
aiohttp's HTTP parser is C, and it already runs on the event loop for kopf and the watches. The operator awaits
`LoopTransport.request` on that loop; no thread is involved.

Same connection settings as the kubeconfig or the in-cluster config (kubernetes.client.Configuration): host, CA,
client certificate, bearer token (re-read through the configuration's refresh hook), basic auth, proxy,
`tls-server-name`, the client's User-Agent.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import aiohttp

from ..metrics import count_request


def ssl_context(config: Any) -> ssl.SSLContext:
    """The TLS settings of a kubernetes.client.Configuration (CA, client certificate, verification) as a context."""
    ctx = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
    if config.cert_file:
        ctx.load_cert_chain(config.cert_file, config.key_file or None)
    if not config.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def new_session(config: Any, timeout: aiohttp.ClientTimeout, user_agent: str | None = None) -> aiohttp.ClientSession:
    """A session to the apiserver of `config` (on the running loop). Raw bytes only (`Accept-Encoding: identity`, no
    decompression): a compressed body could expand past any bound before it is counted."""
    auth = aiohttp.BasicAuth(config.username, config.password) if config.username and config.password else None
    verify: Any = ssl_context(config) if config.host.startswith("https") else False
    headers = {"Accept-Encoding": "identity"}
    if user_agent:
        headers["User-Agent"] = user_agent
    # No cookie jar: the apiserver sets no cookies, and a jar filters every request's cookies for nothing.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=verify, limit=0), timeout=timeout, auth=auth, trust_env=False,
        auto_decompress=False, headers=headers, cookie_jar=aiohttp.DummyCookieJar())


def auth_headers(config: Any) -> dict[str, str]:
    """The bearer token; the configuration's refresh hook re-reads a projected in-cluster token when it is due."""
    headers = {}
    for auth in config.auth_settings().values():
        if auth.get("in") == "header" and auth.get("value"):
            headers[auth["key"]] = auth["value"]
    return headers


# How long LoopTransport reuses the credentials headers it read. A kubeconfig's refresh hook loads the kubeconfig's
# credentials again on every call (a measurable share of the operator's CPU when each write asked for them); the
# in-cluster loader re-reads its projected token once a minute, and the kubelet rotates that token well before it
# expires, so ten seconds late is never too late.
AUTH_HEADERS_TTL = 10.0


class LoopTransport:
    """RestKubeClient's requests, made on `loop` by one aiohttp session (created there on first use)."""

    def __init__(self, config: Any, loop: asyncio.AbstractEventLoop, user_agent: str | None = None,
                 max_body_bytes: int = 64 * 1024 * 1024) -> None:
        self.config = config
        self.loop = loop
        self.user_agent = user_agent
        self.max_body_bytes = max_body_bytes  # an answer longer than this is refused (etcd keeps 1.5 MiB objects)
        self._session: aiohttp.ClientSession | None = None
        # Read once: the configuration's `host` is a property that computes it (and may log) on every read.
        self._base = config.host.rstrip("/")
        self._server_name: str | None = getattr(config, "tls_server_name", None) or None  # a kubeconfig's
        self._auth: tuple[float, dict[str, str]] = (float("-inf"), {})  # (read at, headers)

    def _auth_headers(self) -> dict[str, str]:
        read_at, headers = self._auth
        now = time.monotonic()
        if now - read_at >= AUTH_HEADERS_TTL:
            headers = auth_headers(self.config)
            self._auth = (now, headers)
        return headers

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: bytes, query: list[tuple[str, str]], content_type: str,
                      timeout: float) -> tuple[int, str, bytes]:
        if self._session is None:
            self._session = new_session(self.config, aiohttp.ClientTimeout(total=None), self.user_agent)
        headers = {"Accept": "application/json", "Content-Type": content_type, **self._auth_headers()}
        url = self._base + path
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(timeout):
                    async with self._session.request(
                            method, url, params=query, data=body, headers=headers, allow_redirects=False,
                            proxy=self.config.proxy or None, server_hostname=self._server_name) as resp:
                        data = await _read(resp, self.max_body_bytes)
                        status, reason = resp.status, resp.reason or ""
            except aiohttp.ServerDisconnectedError:
                # Closed before an answer, most often a kept-alive connection the apiserver had already closed: once
                # more on a fresh one. Every request the operator makes but a POST may be sent twice (server-side
                # applies, merge patches, deletes with a uid precondition); an Event posted twice would count twice.
                if attempt == 2 or method == "POST":
                    count_request(method, None)
                    raise
                continue
            except BaseException:
                count_request(method, None)
                raise
            count_request(method, status)
            return status, reason, data
        raise AssertionError("unreachable")


class AnswerTooLong(aiohttp.ClientPayloadError):
    """An answer longer than the transport accepts."""


async def _read(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    while chunk := await resp.content.readany():
        body += chunk
        if len(body) > limit:
            raise AnswerTooLong(f"an answer longer than {limit} bytes")
    return bytes(body)
