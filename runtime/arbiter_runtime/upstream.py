"""The HTTP client for the upstream (vLLM's OpenAI-compatible server): a small interface over aiohttp.

aiohttp rather than httpx on this path: measured on this machine, one POST to an instant upstream cost ~0.37 ms
of client CPU with aiohttp and ~2.6 ms with httpx 0.28 (see docs/benchmarks.md), and this call is made once per
decision. vLLM itself depends on aiohttp, so the image carries it anyway.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from .jsonutil import dumps_bytes


class UpstreamFailure(Exception):
    """A failed call; `kind` feeds arbiter_upstream_errors_total, `retryable` says whether another try may help."""

    def __init__(self, kind: str, message: str, retryable: bool):
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


UPSTREAM_MAX_CONNECTIONS = 512  # the pool's size; the edge keeps this many descriptors for it (edge.py)
# An answer's size bound (answer_bound): the longest token of common vocabularies in UTF-8 bytes (cl100k and
# Llama 3's are at most 128), JSON's worst escape (\u00XX: 6 bytes a byte), what vLLM writes around the choice.
TOKEN_BYTES = 128
ESCAPED = 6
ENVELOPE_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
HEALTH_BODY_BYTES = 64 * 1024


def answer_bound(max_tokens: int, logprob_entries: int = 0) -> int:
    """The most bytes a chat completion of at most `max_tokens` tokens can take, each token bearing
    `logprob_entries` log-probability entries (token, logprob, bytes; scored mode: the chosen one + the labels)."""
    per_entry = 128 + TOKEN_BYTES * (ESCAPED + 4)  # keys and a logprob; the token escaped; "bytes": [255, ...]
    return ENVELOPE_BYTES + max_tokens * (TOKEN_BYTES * ESCAPED + logprob_entries * per_entry)


class UpstreamClient:
    def __init__(self, headers: dict[str, str] | None = None, max_connections: int = UPSTREAM_MAX_CONNECTIONS):
        self._headers = {"content-type": "application/json", **(headers or {})}
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max, limit_per_host=self._max, keepalive_timeout=60)
        # trust_env off: a proxy from the environment must not sit between the runtime and its own pod's vLLM.
        self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, trust_env=False,
                                              skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: Any, timeout: float, max_bytes: int | None = None) -> tuple[int, bytes]:
        """Status and body; a body over `max_bytes` is not read further (UpstreamFailure "too_large"): the
        connection is closed, not returned to the pool, and no more than max_bytes and one read are held."""
        assert self._session is not None, "UpstreamClient.start() first"
        try:
            async with self._session.post(url, data=dumps_bytes(body),
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if max_bytes is None:
                    return resp.status, await resp.read()
                try:
                    return resp.status, await read_capped(resp, max_bytes)
                except AnswerTooLarge as exc:
                    raise UpstreamFailure("too_large", f"upstream {exc} of its max_tokens", retryable=False) \
                        from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure("connect", f"upstream unreachable: {exc.os_error or exc}", retryable=False) \
                from None
        except TimeoutError:
            raise UpstreamFailure("timeout", "upstream timed out", retryable=False) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure("protocol", f"upstream call failed: {type(exc).__name__}", retryable=True) \
                from None

    async def get_status(self, url: str, timeout: float = 2.0) -> int | None:
        """The status of a GET, or None when nothing answers."""
        assert self._session is not None, "UpstreamClient.start() first"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                try:
                    await read_capped(resp, HEALTH_BODY_BYTES)
                except AnswerTooLarge:
                    pass  # the status is the answer; an endless health body costs a closed connection
                return resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None


class EnginePicker:
    """Which of the pod's vLLM engines takes the next request: the one with the fewest requests in flight, ties
    taken in turn. Several engines share a GPU when one engine's scheduler process (a core) is the bound of its
    decisions/s (spec.serving.vllm.engines; docs/gpu.md); an engine that answers slower keeps more in flight and so
    gets fewer. One engine: always it, and no counting."""

    def __init__(self, urls: tuple[str, ...]):
        self.urls = urls
        self.in_flight = [0] * len(urls)
        self._turn = 0

    def pick(self) -> int:
        n = len(self.urls)
        if n == 1:
            return 0
        start = self._turn
        self._turn = (start + 1) % n
        best = start
        for k in range(1, n):
            i = (start + k) % n
            if self.in_flight[i] < self.in_flight[best]:
                best = i
        return best


class AnswerTooLarge(Exception):
    """An answer over its byte bound (read_capped); the message says how large it said it was, if it did."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of an answer from a peer this runtime calls (the upstream, a shadow candidate), or AnswerTooLarge
    once it says or turns out to be over `limit` bytes: the connection is then closed (never returned to the pool
    half-read), and no more than `limit` and one read are ever held, however long the peer goes on sending."""
    if resp.content_length is not None and resp.content_length > limit:
        resp.close()
        raise AnswerTooLarge(f"answer of {resp.content_length} bytes is over the {limit}-byte bound")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            resp.close()
            raise AnswerTooLarge(f"answer is over the {limit}-byte bound")
        chunks.append(chunk)
    return b"".join(chunks)
