"""Context routing: a request whose context header names a context pinned to another version is decided by that version.

The operator writes `routing.json` next to decision.json in every live version's ConfigMap (spec.routing.contexts),
re-read every `poll_s` without a restart (the kubelet updates a mounted ConfigMap in place):

    {"routes": [{"header": "x-decision-context", "value": "underwriting", "version": "2.3",
                 "url": "http://credit--2-3-predictor.ns.svc.cluster.local", "timeoutMs": 7000}]}

A request (V2 infer or /v1/decisions) whose header matches a route of another version is forwarded, after this
runtime's own auth check, to that version's predictor Service, path and body as received (content coding undone),
with the caller's `Authorization`: the pinned version's runtime checks the caller itself (TokenReview and
SubjectAccessReview on `get` of its own InferenceService, which spec.access grants for every live version) and
decides, so its audit record and its metrics are the deciding version's. This runtime answers with what it got back;
it records and counts no decision for it (`arbiter_routed_requests_total` counts the forwarding), so canary and
shadow analyses count only what each version decided, and a forwarded request is never mirrored. A context without a
route, or routed to this version, is decided here.

Refusals, each naming the context and the version: the pinned version does not answer in time or at all (503,
Retry-After); a request that reached this runtime through the platform's authenticating proxy, which keeps the
caller's token, so no identity could be passed on and checked (421: call the model's in-cluster Service with a bearer
token); a request that was forwarded here already and would be forwarded again (508: the versions' routing tables
disagree for a moment after a spec change; retry). An absent or empty file, or `{}`, is "no routes"; a file that
cannot be used is logged once per content, counted (`arbiter_routing_config_errors_total`) and read as no routes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .livefile import poll, read_bounded
from .metrics import Metrics
from .upstream import AnswerTooLarge, read_capped

log = logging.getLogger("arbiter.routing")

ROUTING_FILE = "routing.json"
ROUTED_HEADER = "x-arbiter-routed"  # on a forwarded request: the version that forwarded it
MAX_CONFIG_BYTES = 256 * 1024
MAX_ROUTES = 64
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # the largest batch answer a version sends (256 rows with their trajectories)
MAX_IN_FLIGHT = 1024
_HEADER_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+$")
# What the pinned version needs of the request, and what the caller needs of its answer; nothing else is copied.
REQUEST_HEADERS = ("authorization", "content-type", "accept", "traceparent", "tracestate",
                   "inference-header-content-length")
ANSWER_HEADERS = ("content-type", "inference-header-content-length", "traceparent", "server-timing",
                  "www-authenticate", "retry-after")


class RoutingConfigError(ValueError):
    """routing.json cannot be used; the message names the key."""


@dataclass(frozen=True)
class Route:
    header: str  # lower case
    value: str
    version: str
    url: str
    timeout_ms: int


def parse_routing(raw: Any, own_version: str) -> dict[str, dict[str, Route]]:
    """header -> value -> route, from the decoded routing.json; routes to this very version are left out (decided
    here). RoutingConfigError names what is wrong."""
    if not isinstance(raw, dict):
        raise RoutingConfigError("routing.json must be a JSON object (or {} for no routes)")
    unknown = sorted(set(raw) - {"routes"})
    if unknown:
        shown = ", ".join(repr(str(k)[:24]) for k in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3
                                                                       else "")
        raise RoutingConfigError(f"unknown keys {shown}; the one key is 'routes'")
    routes = raw.get("routes", [])
    if not isinstance(routes, list) or len(routes) > MAX_ROUTES:
        raise RoutingConfigError(f"routes: must be a list of at most {MAX_ROUTES} objects")
    out: dict[str, dict[str, Route]] = {}
    for i, r in enumerate(routes):
        if not isinstance(r, dict) or set(r) - {"header", "value", "version", "url", "timeoutMs"}:
            raise RoutingConfigError(f"routes[{i}]: an object with header, value, version, url and timeoutMs")
        header, value, version, url = r.get("header"), r.get("value"), r.get("version"), r.get("url")
        timeout = r.get("timeoutMs", 10000)
        if not isinstance(header, str) or not _HEADER_RE.match(header.lower()):
            raise RoutingConfigError(f"routes[{i}].header: an HTTP header name (letters, digits, '-')")
        if not isinstance(value, str) or not 0 < len(value) <= 128:
            raise RoutingConfigError(f"routes[{i}].value: 1 to 128 characters")
        if not isinstance(version, str) or not _VERSION_RE.match(version):
            raise RoutingConfigError(f"routes[{i}].version: a version name")
        if not isinstance(url, str) or not _URL_RE.match(url.rstrip("/")):
            raise RoutingConfigError(f"routes[{i}].url: the pinned version's base http(s) URL, e.g. "
                                     "http://credit--2-3-predictor.ns.svc.cluster.local")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 600_000:
            raise RoutingConfigError(f"routes[{i}].timeoutMs: an integer from 1 to 600000")
        if version == own_version:
            continue
        by_value = out.setdefault(header.lower(), {})
        if value in by_value and by_value[value].version != version:
            raise RoutingConfigError(f"routes[{i}]: {header}={value} is pinned to two versions")
        by_value[value] = Route(header.lower(), value, version, url.rstrip("/"), timeout)
    return out


@dataclass(frozen=True)
class Forwarded:
    """The pinned version's answer (status, headers to pass on, body), or this runtime's refusal."""

    status: int
    headers: dict[str, str]
    body: bytes


def _refusal(status: int, message: str, retry: bool = False) -> Forwarded:
    headers = {"content-type": "application/json", **({"retry-after": "1"} if retry else {})}
    return Forwarded(status, headers, json.dumps({"error": message}).encode())


class ContextRouter:
    def __init__(self, version: str, metrics: Metrics, path: str | None, poll_s: float = 2.0):
        self.version = version
        self.metrics = metrics
        self.path = path
        self.poll_s = poll_s
        self.routes: dict[str, dict[str, Route]] = {}
        self.in_flight = 0
        self._last: bytes | None = None
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    # -- configuration -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.path is None:
            return
        self.reload()
        self._poller = asyncio.create_task(poll(self.reload, self.poll_s, self.path, log), name="routing-config")

    def reload(self) -> None:
        assert self.path is not None
        data = read_bounded(self.path, MAX_CONFIG_BYTES)
        if data == self._last:
            return
        self._last = data
        try:
            if len(data) > MAX_CONFIG_BYTES:
                raise RoutingConfigError(f"routing.json is larger than {MAX_CONFIG_BYTES} bytes")
            try:
                raw = json.loads(data.decode("utf-8")) if data.strip() else {}
            except (ValueError, RecursionError) as exc:
                raise RoutingConfigError(f"routing.json is not JSON: {str(exc)[:120]}") from None
            routes = parse_routing(raw, self.version)
        except RoutingConfigError as exc:
            self.metrics.routing_config_errors.inc()
            log.error("%s: %s; no context is routed until it is fixed", self.path, exc)
            self.routes = {}
            return
        if routes != self.routes:
            pins = sorted(f"{r.header}={r.value} -> {r.version}" for v in routes.values() for r in v.values())
            log.info("context routes: %s", "; ".join(pins) or "none")
            for by_value in routes.values():
                for r in by_value.values():
                    self.metrics.routed_to(r.version)
        self.routes = routes

    # -- routing -------------------------------------------------------------------------------------------------
    def match(self, headers: Mapping[str, str]) -> Route | None:
        """The route a request's context header names, when it pins the context to another version."""
        for header, by_value in self.routes.items():
            value = headers.get(header)
            if value is not None and (route := by_value.get(value.strip())) is not None:
                return route
        return None

    async def forward(self, route: Route, path: str, headers: Mapping[str, str], body: bytes,
                      identity_passes: bool) -> Forwarded:
        """Send the request to the pinned version; its answer, or a refusal naming why. identity_passes: the
        caller's identity can go with the request (a bearer token, or auth off)."""
        context = f"{route.header}={route.value}"
        if headers.get(ROUTED_HEADER) is not None:
            self.metrics.routed(route.version, "loop")
            return _refusal(508, f"context {context} is pinned to version {route.version}, and this request was "
                                 f"forwarded here by {headers[ROUTED_HEADER][:64]!r}: the versions' routes disagree "
                                 "for a moment after a change of spec.routing; retry", retry=True)
        if not identity_passes:
            self.metrics.routed(route.version, "refused")
            return _refusal(421, f"context {context} is decided by version {route.version}, and this request came "
                                 "through the platform's authenticating proxy, which keeps the caller's token: no "
                                 "identity can go with it to that version. Call the model's in-cluster Service "
                                 "(status.address.url) with Authorization: Bearer <token>")
        if self.in_flight >= MAX_IN_FLIGHT:
            self.metrics.routed(route.version, "error")
            return _refusal(503, f"context {context}: {MAX_IN_FLIGHT} requests are being forwarded to version "
                                 f"{route.version} already; retry", retry=True)
        if self._session is None:
            # No connection limit of its own (MAX_IN_FLIGHT bounds it); trust_env off: no proxy in between.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                                                  trust_env=False, skip_auto_headers=("User-Agent",),
                                                  auto_decompress=False)
        sent = {k: headers[k] for k in REQUEST_HEADERS if k in headers}
        sent[route.header] = headers[route.header]  # the context, for the deciding version's logs
        sent[ROUTED_HEADER] = self.version
        sent["accept-encoding"] = "identity"  # the answer goes back as it came: no content coding to undo or keep
        self.in_flight += 1
        try:
            async with asyncio.timeout(route.timeout_ms / 1000):
                async with self._session.post(route.url + path, data=body, headers=sent,
                                              allow_redirects=False) as resp:
                    content = await read_capped(resp, MAX_ANSWER_BYTES)
                    kept = {k: resp.headers[k] for k in ANSWER_HEADERS if k in resp.headers}
                    status = resp.status
        except TimeoutError:
            self.metrics.routed(route.version, "error")
            return _refusal(503, f"context {context} is decided by version {route.version}, which did not answer "
                                 f"within {route.timeout_ms} ms; retry", retry=True)
        except AnswerTooLarge:
            self.metrics.routed(route.version, "error")
            return _refusal(503, f"context {context}: version {route.version}'s answer is larger than "
                                 f"{MAX_ANSWER_BYTES} bytes")
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.routed(route.version, "error")
            return _refusal(503, f"context {context} is decided by version {route.version}, which cannot be reached "
                                 f"({type(exc).__name__}); retry", retry=True)
        finally:
            self.in_flight -= 1
        if status >= 500 and status != 503:  # the pinned runtime answers 503 for what it cannot do, never a 500
            self.metrics.routed(route.version, "error")
            return _refusal(503, f"context {context} is decided by version {route.version}, which answered HTTP "
                                 f"{status}; retry", retry=True)
        self.metrics.routed(route.version, "forwarded")
        return Forwarded(status, kept, content)

    async def stop(self) -> None:
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
            try:
                await self._poller
            except BaseException:
                pass
        if self._session is not None:
            await self._session.close()
            self._session = None


def routing_path_for(decision_config: str | os.PathLike[str] | None) -> str | None:
    """routing.json sits in the directory of decision.json (one ConfigMap, mounted as a directory)."""
    if not decision_config:
        return None
    return str(Path(decision_config).parent / ROUTING_FILE)
