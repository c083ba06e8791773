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


class UpstreamClient:
    def __init__(self, headers: dict[str, str] | None = None, max_connections: int = 512):
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

    async def post(self, url: str, body: Any, timeout: float) -> tuple[int, bytes]:
        assert self._session is not None, "UpstreamClient.start() first"
        try:
            async with self._session.post(url, data=dumps_bytes(body),
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status, await resp.read()
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
                await resp.read()
                return resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None
