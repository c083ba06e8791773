"""List and watch the kinds of the operator's children on the apiserver's wire format, outside kopf: one asyncio task
per kind and watched namespace (or per kind, cluster-wide), on the operator's event loop.

Why not kopf: each child event went through kopf's per-event machinery (a Body and a logger per event, registry
lookups, index and handler bookkeeping), several times the work of what the operator does with it, and a child kind
sees about seven times the events of the DecisionModels themselves (KServe's status updates, Deployment and pod status
churn). Here a line is decoded once, without managedFields (`api.kubejson`), and handed to the caller's callbacks as a
plain dict.

- LIST in pages (`limit`/`continue`), then WATCH from the list's resourceVersion (`allowWatchBookmarks`, the server
  ending it after `timeout_seconds`), again and again; a BOOKMARK only moves the resourceVersion.
- 410 Gone (as a status, as an ERROR event, on a list's `continue`) or another ERROR event: list again; the callback
  `on_list` gets the whole new content of that kind in that scope, so the caller can drop what went away meanwhile.
- A broken stream, a timeout, an error status: retry after a doubling back-off (at least the answer's Retry-After, up
  to the cap), watching on from the last resourceVersion; listing again after a few failures in a row, so a
  resourceVersion the peer does not know never keeps it stuck.
- Every answer may be hostile: a line or page is bounded in bytes, a list or watch in time; a line that is not JSON,
  not an event, or whose object is not a well-formed object of the kind (metadata, name, namespace, labels,
  resourceVersion of the right types, the selector's label present) is skipped; a list page holding such an item
  fails as a whole (nothing is acted on half of an answer). No exception ends a task but cancellation.
- One object the decoders cannot build (nested deeper than they go: the apiserver admits 10,000 levels) fails
  nothing: it is handed on as a stand-in (`api.kubejson.refused`: its metadata and the reason), in a list page as in
  a watch line, and the reconcile reports it on the object's status; the rest of the page is decoded as usual.
- For the kinds the caller names (`skim`), an event's type, namespace, name and resourceVersion are read first; an
  ADDED or MODIFIED of an object the caller says it holds at that resourceVersion (`known`: most often the echo of
  its own write) is not decoded whole nor handed on, only its resourceVersion moves the watch on.
- A kind the apiserver does not serve (404 on the first list) counts as listed, empty, and is not asked again (as
  kopf discovered resources once at start-up: restart the operator after installing KServe or the Route API); a 404
  once the kind was listed is a fault like any other.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from ..api import jsonfast
from ..api.kubejson import event_head, loads_event
from ..api.wire import bookmark_version, resource_version, retry_after, status_reason
from ..metrics import WATCH_BYTES, WATCH_EVENTS
from .kinds import STATUS_ONLY
from .resource import (
    NAMESPACE_NAME,
    Failed,
    Gone,
    Known,
    NotServed,
    OnEvent,
    OnList,
    Resource,
    WatchOptions,
    list_page,
    namespaces,
    note_refused,
    object_of,
    short,
)
from .transport import auth_headers, new_session

# The vocabulary lives in kube/resource.py; these are the names the watches' callers import from here.
__all__ = ["NAMESPACE_NAME", "Failed", "Gone", "Known", "NotServed", "OnEvent", "OnList", "Resource", "WatchOptions",
           "Watches", "list_page", "namespaces", "object_of"]

log = logging.getLogger("arbiter.watches")

ERROR_BODY_BYTES = 64 * 1024
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


class Watches:
    """One list/watch task per (resource, scope). `primed` is set once every scope's first list is handed to
    `on_list`: until then the caller's cache is half-filled."""

    def __init__(self, config: Any, resources: list[Resource], namespaces: list[str], on_event: OnEvent,
                 on_list: OnList, options: WatchOptions | None = None, known: Known | None = None,
                 skim: frozenset[str] = frozenset()) -> None:
        """known, skim: for the kinds in `skim` (those whose events are mostly echoes of the caller's own writes),
        each event's type and its object's namespace, name and resourceVersion are read first, and an ADDED or
        MODIFIED of an object `known` says the caller holds as it is goes no further."""
        self.config = config  # kubernetes.client.Configuration: host, TLS, the token (and its refresh hook)
        self.resources = list(resources)
        self.scopes: list[str | None] = list(namespaces) or [None]
        self.on_event, self.on_list = on_event, on_list
        self.known, self.skim = known, skim
        self.options = options or WatchOptions()
        self.primed = asyncio.Event()
        # The (resource, scope) pairs whose first list is still to come; `add` puts none here.
        self._waiting = {(r, s) for r in self.resources for s in (self.scopes if r.namespaced else [None])}
        self._tasks: dict[tuple[Resource, str | None], asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        if not self._waiting:
            self.primed.set()

    def start(self) -> Watches:
        """Start the tasks (on the running event loop). aiohttp, not httpx: its HTTP parser is C, and reading the
        streams through httpx's pure-Python one (h11, anyio) was an eighth of the operator's CPU at fleet scale."""
        o = self.options
        # No sock_read: aiohttp would move a timer on every chunk read; a watch's silence is bounded by _Silence.
        self._session = new_session(
            self.config, aiohttp.ClientTimeout(total=None, sock_connect=o.connect_timeout))
        # aiohttp sends a GET again, at once, when a kept-alive connection fails before the answer began; a retry is
        # this module's decision, after its back-off and from a fresh list, so a peer sees each attempt once.
        # (aiohttp has no public setting for it; the attribute is there since 3.10.)
        if hasattr(self._session, "_retry_connection"):
            self._session._retry_connection = False
        for resource in self.resources:
            self._spawn(resource)
        return self

    def _spawn(self, resource: Resource) -> None:
        for scope in self.scopes if resource.namespaced else [None]:
            name = f"watch-{resource.plural}-{scope or resource.field_selector or resource.selector or 'all'}"
            self._tasks[(resource, scope)] = asyncio.get_running_loop().create_task(
                self._follow(resource, scope), name=name)

    def add(self, resource: Resource) -> None:
        """Follow one more resource (on a started Watches), e.g. the Namespace a DecisionModel appeared in. It does not
        hold `primed` back: that is about the resources the Watches started with."""
        if resource not in self.resources:
            self.resources.append(resource)
            self._spawn(resource)

    def remove(self, resource: Resource) -> None:
        """Stop following `resource` (its tasks are cancelled; they end on their own)."""
        if resource in self.resources:
            self.resources.remove(resource)
        for key in [k for k in self._tasks if k[0] == resource]:
            self._tasks.pop(key).cancel()

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self._tasks.values())

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/json", **auth_headers(self.config)}

    def _params(self, resource: Resource, **extra: str) -> dict[str, str]:
        params: dict[str, str] = {}
        labels = ",".join(filter(None, (resource.label, resource.selector)))
        if labels:
            params["labelSelector"] = labels
        if resource.field_selector:
            params["fieldSelector"] = resource.field_selector
        return {**params, **extra}

    def _primed(self, resource: Resource, namespace: str | None) -> None:
        self._waiting.discard((resource, namespace))
        if not self._waiting:
            self.primed.set()

    async def _follow(self, resource: Resource, namespace: str | None) -> None:
        what = (f"{resource.plural} in {namespace or 'all namespaces'}" if resource.namespaced else
                f"{resource.plural} {resource.field_selector or resource.selector or ''}".rstrip())
        o = self.options
        rv, failures, retry_after, primed = "", 0, None, False
        while True:
            try:
                if failures:
                    delay = o.backoff.delay(failures - 1)
                    if retry_after is not None:  # the peer asked for a pause: grant it, up to the back-off's cap
                        delay = max(delay, min(retry_after, o.backoff.cap))
                    await asyncio.sleep(delay)
                if failures >= o.relist_after:
                    rv = ""
                started = time.monotonic()
                retry_after, failed = None, False
                try:
                    if not rv:
                        objs, rv = await self._list(resource, namespace)
                        self._call(what, self.on_list, resource, namespace, objs, rv)
                        if not primed:
                            primed = True
                            self._primed(resource, namespace)
                    async for type_, obj, event_rv in self._watch(resource, namespace, rv):
                        rv = event_rv or rv
                        if obj is not None:
                            self._call(what, self.on_event, resource, type_, obj)
                except NotServed as exc:
                    # Served at start-up, or a built-in kind: a 404 now is a fault (a proxy, a restarting apiserver).
                    if primed or resource.always_served:
                        log.warning("watch on %s failed (%s); retrying", what, exc)
                        failed = True
                    else:
                        log.warning("%s: the apiserver does not serve %s (%s); not watched until the operator "
                                    "restarts", what, resource.kind, exc)
                        self._call(what, self.on_list, resource, namespace, [], "")
                        self._primed(resource, namespace)
                        return
                except Gone as exc:  # list again (at once after a watch that lasted)
                    log.info("watch on %s: %s; listing again", what, exc)
                    rv = ""
                except Failed as exc:
                    log.warning("watch on %s failed (%s); retrying", what, exc)
                    retry_after, failed = exc.retry_after, True
                except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError) as exc:
                    log.warning("watch on %s interrupted (%s); retrying", what, short(exc, 300) or type(exc).__name__)
                    failed = True
                healthy = time.monotonic() - started >= o.healthy_after
                failures = failures + 1 if failed or not healthy else 0
            except asyncio.CancelledError:
                raise
            except Exception:  # a defect: logged, and the watch goes on after a back-off
                log.exception("watch on %s: unexpected error; retrying", what)
                failures += 1

    def _call(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # the caller's defect must not end the watch (nor make it list again in a loop)
            log.exception("watch on %s: handling an event failed", what)

    async def _open(self, resource: Resource, namespace: str | None, params: dict[str, str],
                    stack: list[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
        assert self._session is not None
        server_name = getattr(self.config, "tls_server_name", None)  # a kubeconfig's tls-server-name
        resp = await self._session.get(
            self.config.host.rstrip("/") + resource.path(namespace), params=params, headers=self._headers(),
            proxy=self.config.proxy or None, server_hostname=server_name or None, allow_redirects=False)
        stack.append(resp)
        if resp.status == 200:
            return resp
        body = bytearray()
        try:
            while len(body) < ERROR_BODY_BYTES and (chunk := await resp.content.readany()):
                body += chunk
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        try:
            status: Any = jsonfast.loads(bytes(body[:ERROR_BODY_BYTES]))
        except (ValueError, RecursionError):
            status = None
        reason = f"HTTP {resp.status} ({status_reason(status) if status is not None else 'no Status body'})"
        if resp.status == 410:
            raise Gone(reason)
        if resp.status == 404 and "watch" not in params and "continue" not in params:
            raise NotServed(reason)
        raise Failed(reason, retry_after(resp.headers.get("Retry-After")))

    async def _list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """Every object of the scope (all pages), and the list's resourceVersion."""
        o = self.options
        objs: list[dict[str, Any]] = []
        token = ""
        while True:
            params = self._params(resource, limit=str(o.page_size), **({"continue": token} if token else {}))
            stack: list[aiohttp.ClientResponse] = []
            body = bytearray()
            try:
                async with asyncio.timeout(o.list_timeout):
                    resp = await self._open(resource, namespace, params, stack)
                    while chunk := await resp.content.readany():
                        body += chunk
                        if len(body) > o.max_page_bytes:
                            raise Failed(f"a list page longer than {o.max_page_bytes} bytes")
            finally:
                for r in stack:
                    r.close()
            page, rv, token = list_page(resource, namespace, bytes(body))
            objs += page
            if not token:
                return objs, rv

    async def _watch(self, resource: Resource, namespace: str | None,
                     rv: str) -> AsyncIterator[tuple[str, dict[str, Any] | None, str]]:
        """(type, object or None for a BOOKMARK, resourceVersion) of each well-formed event of one watch."""
        o = self.options
        params = self._params(resource, watch="true", resourceVersion=rv, allowWatchBookmarks="true",
                              timeoutSeconds=str(o.timeout_seconds))
        stack: list[aiohttp.ClientResponse] = []
        buffer = bytearray()
        events, received = WATCH_EVENTS.labels(resource.kind), WATCH_BYTES.labels(resource.kind)
        silence: _Silence | None = None
        try:
            async with asyncio.timeout(o.timeout_seconds + o.read_timeout):  # a peer that never ends the watch
                try:
                    async with asyncio.timeout(o.read_timeout):
                        resp = await self._open(resource, namespace, params, stack)
                except TimeoutError:
                    raise aiohttp.ServerTimeoutError(f"no answer to the watch for {o.read_timeout:.0f}s") from None
                silence = _Silence(resp, o.read_timeout)
                while chunk := await resp.content.readany():
                    silence.heard()
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        if end - start > o.max_event_bytes:  # whole within one read, and too long all the same
                            raise Failed(f"a watch event longer than {o.max_event_bytes} bytes")
                        line = bytes(buffer[start:end])
                        start = end + 1
                        if line.strip():
                            event = self._event(resource, namespace, line)
                            if event is not None:
                                if event[0] != "BOOKMARK":
                                    events.inc()
                                    received.inc(len(line))
                                yield event
                    del buffer[:start]
                    if len(buffer) > o.max_event_bytes:
                        raise Failed(f"a watch event longer than {o.max_event_bytes} bytes")
        except aiohttp.ServerTimeoutError:
            raise  # silence on the connection for read_timeout: a failure (aiohttp's is also a TimeoutError)
        except TimeoutError:
            return  # the watch outlived its timeout: watch again from the last resourceVersion
        finally:
            if silence is not None:
                silence.stop()
            for r in stack:
                r.close()

    @staticmethod
    def _known(known: Known, resource: Resource, head: tuple[str, str, str, str]) -> bool:
        try:
            return bool(known(resource, head[1], head[2], head[3]))
        except Exception:  # the caller's defect: the event is decoded and handed on as any other
            log.exception("watch on %s: judging an event failed", resource.plural)
            return False

    def _event(self, resource: Resource, namespace: str | None,
               line: bytes) -> tuple[str, dict[str, Any] | None, str] | None:
        """(type, the object, or None where there is nothing to hand on, resourceVersion) of one line."""
        if self.known is not None and resource.kind in self.skim:
            head = event_head(line)
            if head is not None and head[0] in ("ADDED", "MODIFIED") and namespace in (None, head[1]) and \
                    self._known(self.known, resource, head):
                return head[0], None, head[3]  # held as it is: only the resourceVersion moves on
        decoded = loads_event(line, resource.kind in STATUS_ONLY)
        if decoded is None:
            return None
        type_, obj = decoded
        if type_ == "ERROR":  # the apiserver ends a watch after one; 410 or not, a fresh list is the way on
            raise Gone(f"watch ERROR event ({status_reason(obj)})")
        if type_ == "BOOKMARK":
            rv = bookmark_version(obj)
            return ("BOOKMARK", None, rv) if rv else None
        if type_ not in EVENT_TYPES:
            return None
        held = object_of(resource, namespace, obj, deleted=type_ == "DELETED")
        if held is None:
            return None
        note_refused(held)
        return type_, held, resource_version(held["metadata"].get("resourceVersion"))


class _Silence:
    """Ends a watch whose connection has been silent for `limit` seconds with aiohttp's ServerTimeoutError (a failure,
    retried with back-off), as a sock_read timeout would, but without moving a timer on every chunk: a chunk only
    notes the time, and a timer looks every quarter of `limit` (so silence is noticed within 1.25 x `limit`)."""

    def __init__(self, resp: aiohttp.ClientResponse, limit: float) -> None:
        self._resp, self._limit = resp, limit
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer = self._loop.call_later(limit / 4, self._look)

    def heard(self) -> None:
        self._last = self._loop.time()

    def _look(self) -> None:
        if self._loop.time() - self._last >= self._limit:
            self._resp.content.set_exception(
                aiohttp.ServerTimeoutError(f"no data on the watch for {self._limit:.0f}s"))
        else:
            self._timer = self._loop.call_later(self._limit / 4, self._look)

    def stop(self) -> None:
        self._timer.cancel()
