"""The artifact check's S3 reads honour the environment's proxy settings (HTTP_PROXY / HTTPS_PROXY, NO_PROXY), as
OLM's cluster proxy sets them on the operator's Deployment: a read goes to the proxy, with the S3 URL in the request
line, unless NO_PROXY names the endpoint. The proxy here is a real HTTP server on loopback (support/hostile_s3.py)."""

from __future__ import annotations

import re

import pytest
from arbiter_operator.clients.s3 import S3Credentials, S3Storage, StorageUnreachable
from support.hostile_s3 import Answer, HostileS3

# An endpoint nobody listens on: only a proxy can answer for it.
ENDPOINT = "http://s3.proxied.invalid:9000"
CREDS = S3Credentials("AKIA-A", "secret-a", endpoint_url=ENDPOINT)


@pytest.fixture
def proxy(monkeypatch):
    peer = HostileS3().start()
    peer.reset(lambda request: Answer(200, b'{"architectures": ["X"]}'))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", peer.endpoint_url)
    yield peer
    peer.stop()


async def test_a_read_goes_through_the_proxy(proxy):
    async with S3Storage(CREDS) as storage:
        assert await storage.get_bytes("models", "credit/config.json") == b'{"architectures": ["X"]}'
    [request] = proxy.requests
    assert request.path == "/models/credit/config.json"
    assert request.headers["host"] == "s3.proxied.invalid:9000"  # the S3 endpoint's, as signed
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIA-A/")


async def test_no_proxy_sends_the_read_to_the_endpoint_itself(proxy, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "s3.proxied.invalid")
    async with S3Storage(CREDS, connect_timeout=1, read_timeout=1) as storage:
        with pytest.raises(StorageUnreachable, match=re.escape("cannot reach S3 at http://s3.proxied.invalid:9000")):
            await storage.get_bytes("models", "credit/config.json")
    assert proxy.requests == []
