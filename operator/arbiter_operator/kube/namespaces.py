"""List and watch Namespaces on the apiserver's wire format, for the operator's own namespace watches
(kube/shard.py: the namespaces a shard owns; nswatch.py: the labels of namespaces holding DecisionModels),
which run outside kopf.

The kubernetes library's `watch.Watch` is not used: it reads a line of any length into memory, an error body whole,
and raises on an event that is JSON but not an event (a list, an object without `object`), which ends the watch.
Here every answer is treated as possibly hostile:

- what is read is bounded: a list answer (`max_list_bytes`), one watch event (`max_event_bytes`), an error body
  (64 KiB), a list's and a watch's duration (a peer that never stops talking);
- an event that is not a well-formed Namespace event (not JSON, not an object, a missing or wrong-typed type, object,
  metadata, name or labels, a name that is not a namespace name, an unknown type) is skipped; a BOOKMARK only moves
  the resourceVersion; an ERROR event ends the watch (410: the resourceVersion expired, list again);
- a list that is not a well-formed NamespaceList is a failure as a whole: nothing is acted on half of an answer;
- `follow` lists, watches from the list's resourceVersion and starts again, waiting (`backoff`, and at least the
  answer's Retry-After, up to the cap) after every failure and after every watch that ended early: a peer that
  answers at once, with an error or an empty stream, is asked again at a bounded rate, never in a tight loop. After
  a failure it lists again (as client-go's reflector does), so it never stays stuck on a resourceVersion that the
  peer does not know.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s

from ..api import jsonfast
from ..api.backoff import WATCH_RESTART_BACKOFF, DoublingBackoff
from ..api.kubejson import loads_event
from ..api.wire import bookmark_version, resource_version, retry_after, status_reason

log = logging.getLogger("arbiter.namespaces")

PATH = "/api/v1/namespaces"
# A namespace name is a DNS-1123 label (the apiserver validates it); anything else in an answer is not a namespace.
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
ERROR_BODY_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


@dataclass(frozen=True)
class WatchOptions:
    """How the namespace watches talk to the apiserver; the defaults are the product's, tests shorten them."""

    timeout_seconds: int = 300  # asked of the apiserver for each watch
    connect_timeout: float = 30.0
    read_timeout: float = 330.0  # silence on a connection (a watch's longest gap is the apiserver's timeout)
    list_timeout: float = 60.0  # a whole list answer
    max_list_bytes: int = 64 * 1024 * 1024  # ~50,000 namespaces
    max_event_bytes: int = 4 * 1024 * 1024  # one watch event; etcd stores objects of at most 1.5 MiB by default
    # A watch that ended (or failed) sooner than this after its list/watch began counts as a failure: the next
    # attempt waits. A real apiserver keeps a watch open for `timeout_seconds`; a proxy may cut idle connections
    # sooner (30 s is common), which should not cost a back-off.
    healthy_after: float = 10.0
    backoff: DoublingBackoff = field(default=WATCH_RESTART_BACKOFF)


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: dict[str, str]
    resource_version: str


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    namespace: Namespace | None  # None for a BOOKMARK
    resource_version: str  # "" when the event carried none


class Gone(Exception):
    """The resourceVersion is too old (410 Gone, as a status or as an ERROR event): list again."""


class Failed(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def namespace_of(obj: Any) -> Namespace | None:
    """The Namespace in a list item or a watch event's object, or None where it is not a well-formed one (pure)."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return None
    labels = meta.get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return None
    return Namespace(name, dict(labels), resource_version(meta.get("resourceVersion")))


def parse_event(line: bytes) -> Event | None:
    """One line of a watch stream: the event, or None where it is not a well-formed Namespace event (pure). An ERROR
    event raises: the apiserver ends a watch after one."""
    decoded = loads_event(line)
    if decoded is None:
        return None
    kind, obj = decoded
    if kind == "ERROR":
        if isinstance(obj, dict) and obj.get("code") == 410:
            raise Gone(status_reason(obj))
        raise Failed(f"watch ERROR event ({status_reason(obj)})")
    if kind == "BOOKMARK":
        rv = bookmark_version(obj)
        return Event("BOOKMARK", None, rv) if rv else None
    if kind not in EVENT_TYPES:
        return None
    ns = namespace_of(obj)
    return Event(kind, ns, ns.resource_version) if ns is not None else None


def parse_list(body: bytes) -> tuple[dict[str, Namespace], str]:
    """A NamespaceList answer: its namespaces by name and its resourceVersion; Failed unless every part is
    well-formed (pure)."""
    try:
        doc = jsonfast.loads(body)
    except (ValueError, RecursionError):
        raise Failed("the namespace list is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list) or not isinstance(doc.get("metadata"), dict):
        raise Failed("the namespace list is not a NamespaceList")
    rv = resource_version(doc["metadata"].get("resourceVersion"))
    if not rv:
        raise Failed("the namespace list has no resourceVersion")
    found: dict[str, Namespace] = {}
    for item in doc["items"]:
        ns = namespace_of(item)
        if ns is None:
            raise Failed("the namespace list holds an item that is not a Namespace")
        found[ns.name] = ns
    return found, rv


def _open(api: k8s.ApiClient, query: list[tuple[str, str]], read_timeout: float,
          connect_timeout: float) -> urllib3.BaseHTTPResponse:
    """GET /api/v1/namespaces with the client's credentials and TLS settings, nothing read yet. Raises Gone/Failed
    for an error status, having read at most 64 KiB of its body."""
    config = api.configuration
    headers = {**api.default_headers, "Accept": "application/json"}
    for auth in config.auth_settings().values():  # the bearer token (refreshed by the configuration's hook)
        if auth.get("in") == "header" and auth.get("value"):
            headers[auth["key"]] = auth["value"]
    url = f"{config.host}{PATH}?{urlencode(query)}"
    # The pool of the client's REST layer (its TLS settings), without urllib3's own retries: a retry is this
    # module's decision, after a back-off, and a peer sees each attempt once.
    resp: urllib3.BaseHTTPResponse = api.rest_client.pool_manager.request(
        "GET", url, headers=headers, preload_content=False, retries=False,
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout))
    if resp.status == 200:
        return resp
    try:
        body = resp.read(ERROR_BODY_BYTES)
    except Exception:
        body = b""
    finally:
        _close(resp)
    try:
        status: Any = jsonfast.loads(body)
    except (ValueError, RecursionError):
        status = None
    reason = f"HTTP {resp.status} ({status_reason(status) if status is not None else 'no Status body'})"
    if resp.status == 410:
        raise Gone(reason)
    raise Failed(reason, retry_after(resp.headers.get("Retry-After")))


def _close(resp: urllib3.BaseHTTPResponse) -> None:
    # Closed rather than returned to the pool: what is left unread (a hostile peer's endless body) is never read.
    try:
        resp.close()
        resp.release_conn()
    except Exception:
        pass


def list_namespaces(api: k8s.ApiClient, query: list[tuple[str, str]],
                    options: WatchOptions) -> tuple[dict[str, Namespace], str]:
    resp = _open(api, query, options.read_timeout, options.connect_timeout)
    deadline = time.monotonic() + options.list_timeout
    body = bytearray()
    try:
        for chunk in resp.stream(READ_CHUNK, decode_content=False):
            body += chunk
            if len(body) > options.max_list_bytes:
                raise Failed(f"the namespace list is longer than {options.max_list_bytes} bytes")
            if time.monotonic() > deadline:
                raise Failed(f"the namespace list took longer than {options.list_timeout:.0f}s")
    finally:
        _close(resp)
    return parse_list(bytes(body))


def watch_namespaces(api: k8s.ApiClient, query: list[tuple[str, str]], resource_version: str,
                     options: WatchOptions) -> Iterator[Event]:
    """The well-formed events of one watch from `resource_version`, until the apiserver ends it (or its timeout and
    the read timeout have passed: a peer that never ends it)."""
    query = [*query, ("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
             ("timeoutSeconds", str(options.timeout_seconds))]
    resp = _open(api, query, options.read_timeout, options.connect_timeout)
    deadline = time.monotonic() + options.timeout_seconds + options.read_timeout
    buffer = bytearray()
    try:
        for chunk in resp.stream(READ_CHUNK, decode_content=False):
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                line = bytes(buffer[start:end])
                start = end + 1
                if line.strip():
                    event = parse_event(line)
                    if event is not None:
                        yield event
            del buffer[:start]
            if len(buffer) > options.max_event_bytes:
                raise Failed(f"a watch event longer than {options.max_event_bytes} bytes")
            if time.monotonic() > deadline:
                return
    finally:
        _close(resp)


def follow(api: k8s.ApiClient, query: list[tuple[str, str]], *, what: str,
           on_list: Callable[[dict[str, Namespace]], bool], on_event: Callable[[Event], bool],
           stop: threading.Event, wanted: Callable[[], bool] = lambda: True, resource_version: str = "",
           options: WatchOptions | None = None) -> None:
    """List (unless `resource_version` is given), then watch from the list's resourceVersion, again and again, until
    `stop` is set, `wanted()` is False, or a callback returns False. `on_list` gets every list answer, `on_event`
    every ADDED/MODIFIED/DELETED event; neither sees anything that is not well-formed."""
    options = options or WatchOptions()
    rv = resource_version
    failures = 0
    retry_after: float | None = None

    def going() -> bool:
        return not stop.is_set() and wanted()

    while going():
        if failures:
            delay = options.backoff.delay(failures - 1)
            if retry_after is not None:  # the peer asked for a pause: grant it, up to the back-off's cap
                delay = max(delay, min(retry_after, options.backoff.cap))
            stop.wait(delay)
            if not going():
                return
        started = time.monotonic()
        retry_after = None
        failed = False
        try:
            if not rv:
                found, rv = list_namespaces(api, query, options)
                if not on_list(found):
                    return
            for event in watch_namespaces(api, query, rv, options):
                if not going():
                    return
                rv = event.resource_version or rv
                if event.namespace is not None and not on_event(event):
                    return
        except Gone as exc:  # the resourceVersion expired: list again (at once after a watch that lasted)
            log.info("watch on %s: resourceVersion expired (%s); listing again", what, exc)
            rv = ""
        except Failed as exc:
            log.warning("watch on %s failed (%s); retrying", what, exc)
            retry_after, failed = exc.retry_after, True
        except Exception as exc:  # a refused, reset or dropped connection, a timeout, a broken chunk
            log.warning("watch on %s interrupted (%s); retrying", what, str(exc)[:300] or type(exc).__name__)
            failed = True
        healthy = time.monotonic() - started >= options.healthy_after
        if healthy:
            failures = 0
        if failed or not healthy:
            failures += 1
            rv = ""  # list again: a resourceVersion the peer handed out may be one it does not know
