"""The operator's Prometheus endpoint, `GET /metrics` on --metrics-port, served as controller-runtime's metrics server
serves a manager's: HTTPS with the certificate in --metrics-cert-dir, and every scrape's bearer token judged by the
apiserver (kube/authn.py: a TokenReview, then a SubjectAccessReview for `get` on `/metrics`) unless
--metrics-auth=false. Plain HTTP only without a certificate directory (local development).

Why aiohttp on the operator's event loop rather than prometheus_client's `start_http_server`: that server (a thread
running http.server) answers every request and cannot ask the apiserver first, and aiohttp already serves kopf's
probes and the webhook in this process. The reviews are awaited on the loop like every other apiserver request; the
page itself is encoded in a worker thread, as the previous server did, so a large page does not hold the loop for the
whole encoding.

The page is prometheus_client's default registry (process and Python collectors, and the operator's own:
arbiter_operator/metrics.py), encoded as prometheus_client's own server encodes it: OpenMetrics when the scraper asks
for it, the text format otherwise, gzip when accepted.

The certificate is re-read when its files change (on OpenShift the service CA rotates the Secret the chart mounts,
and the kubelet updates the files): each new connection is handed the latest certificate during its handshake (an
SNI callback, called for every handshake, SNI or not); a pair that does not load (caught between two file writes)
leaves the previous one in use until the next check.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder, gzip_accepted

from . import metrics  # noqa: F401  (registers the operator's collectors before the first scrape)
from .kube.authn import Denied, NonResource, Reviewer
from .kube.client import new_api_client
from .kube.transport import LoopTransport

log = logging.getLogger("arbiter.metrics")

PATH = "/metrics"
# Seconds between two looks at the certificate files (kopf's webhook server looks as often).
CERT_CHECK_SECONDS = 10.0
# The longest header field the server reads: a bearer token of authn.MAX_TOKEN_BYTES fits, so an oversized one gets
# authn's 401 rather than the HTTP parser's 400; beyond this the parser refuses the request.
MAX_FIELD_BYTES = 32 * 1024
# An answer to a review is a few hundred bytes (the user's groups and extra); more is not a review.
MAX_REVIEW_ANSWER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class MetricsConfig:
    port: int
    address: str = "0.0.0.0"
    cert: ServingCert | None = None  # None: plain HTTP
    auth: bool = True
    kubeconfig: str | None = None  # where the reviews' credentials come from (None: in-cluster, then $KUBECONFIG)


class ServingCert:
    """The server's TLS settings from tls.crt and tls.key in `directory`, following the files as they rotate. Loaded
    when made, so a missing or broken pair stops the operator at start-up, naming the file."""

    def __init__(self, directory: Path) -> None:
        self.files = (directory / "tls.crt", directory / "tls.key")
        self._digest = self._read_digest()
        self._current = self._load()
        # The context the listener holds: its handshakes are handed `_current` (see `_handshake`).
        self.context = self._load()
        self.context.sni_callback = self._handshake

    def _read_digest(self) -> str:
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(*self.files)
        return ctx

    def _handshake(self, conn: Any, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        conn.context = self._current

    def refresh(self) -> bool:
        """Load the files again if they changed; whether a new certificate is now in use."""
        try:
            digest = self._read_digest()
            if digest == self._digest:
                return False
            loaded = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("metrics certificate in %s not reloaded (%s); the previous one stays in use",
                        self.files[0].parent, exc)
            return False
        self._current, self._digest = loaded, digest
        log.info("metrics certificate reloaded from %s", self.files[0].parent)
        return True

    async def follow(self, interval: float = CERT_CHECK_SECONDS) -> None:
        while True:
            await asyncio.sleep(interval)
            self.refresh()


def _refusal(denied: Denied) -> web.Response:
    headers = {"Content-Type": "application/json"}
    if denied.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="arbiter-operator"'
    elif denied.status == 503:
        headers["Retry-After"] = "1"
    return web.Response(status=denied.status, body=orjson.dumps({"error": denied.message}), headers=headers)


class MetricsServer:
    """GET /metrics on `config.address:config.port`; `reviewer` None: every scrape is answered. `transport`: the
    reviews' own, closed with the server."""

    def __init__(self, config: MetricsConfig, reviewer: Reviewer | None,
                 transport: LoopTransport | None = None) -> None:
        self.config = config
        self.reviewer = reviewer
        self.transport = transport
        self._runner: web.AppRunner | None = None
        self._follow: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The port listened on (the configured one, or the one picked for port 0)."""
        assert self._runner is not None, "not started"
        return int(self._runner.addresses[0][1])

    async def _scrape(self, request: web.Request) -> web.Response:
        try:
            if self.reviewer is not None:
                user = await self.reviewer.authorize(request.headers.getall("Authorization", []))
                log.debug("metrics scraped by %s", user.name)
            encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
            body = await asyncio.to_thread(encoder, REGISTRY)
        except Denied as denied:
            # 503 is the operator's problem (its apiserver, its grants); 401 and 403 are the scraper's, in its own
            # target status.
            level = logging.WARNING if denied.status == 503 else logging.DEBUG
            log.log(level, "metrics scrape refused (%d): %s", denied.status, denied.message)
            return _refusal(denied)
        except Exception as exc:  # a collector that raised: answered, never a 500
            log.warning("metrics page not collected: %s", type(exc).__name__)
            return _refusal(Denied(503, f"the metrics could not be collected ({type(exc).__name__}); retry"))
        response = web.Response(body=body, headers={"Content-Type": content_type})
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            response.enable_compression(web.ContentCoding.gzip)
        return response

    async def start(self) -> MetricsServer:
        app = web.Application(client_max_size=1024)  # a scrape has no body
        app.router.add_get(PATH, self._scrape)
        self._runner = web.AppRunner(app, access_log=None, max_field_size=MAX_FIELD_BYTES, handle_signals=False)
        await self._runner.setup()
        cert = self.config.cert
        site = web.TCPSite(self._runner, self.config.address, self.config.port,
                           ssl_context=cert.context if cert else None)
        await site.start()
        if cert is not None:
            self._follow = asyncio.get_running_loop().create_task(cert.follow(), name="metrics-cert")
        return self

    async def stop(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
            self._follow = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.transport is not None:
            await self.transport.close()


async def serve(config: MetricsConfig) -> MetricsServer:
    """The operator's metrics server, started on the running loop, its reviews sent with the operator's credentials."""
    reviewer = transport = None
    if config.auth:
        api = new_api_client(config.kubeconfig)
        transport = LoopTransport(api.configuration, asyncio.get_running_loop(), user_agent=api.user_agent,
                                  max_body_bytes=MAX_REVIEW_ANSWER_BYTES)
        reviewer = Reviewer(transport, NonResource(PATH, "get"))
    server = await MetricsServer(config, reviewer, transport).start()
    scheme = "https" if config.cert else "http"
    if not config.auth:
        log.warning("metrics served on %s://%s:%d%s to anyone who reaches the port (--metrics-auth=false)",
                    scheme, config.address, server.port, PATH)
    elif config.cert is None:
        log.warning("metrics served on http://%s:%d%s: scrapers' bearer tokens cross the network unencrypted; "
                    "give --metrics-cert-dir", config.address, server.port, PATH)
    else:
        log.info("metrics served on https://%s:%d%s to readers the apiserver allows get %s", config.address,
                 server.port, PATH, PATH)
    return server
