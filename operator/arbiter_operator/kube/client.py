"""A small Kubernetes client: get, list, server-side apply, status patch, delete, events. No logic.

Raw REST over `kubernetes.client.ApiClient` (no discovery round-trips, one code path for built-in and custom kinds).
Every mutating call is logged with the `kube-write` prefix (nothing is kept in memory), so tests can prove from the
log that a converged reconcile writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import jsonfast, kubejson
from ..api.names import CORE_API, FIELD_MANAGER
from ..api.times import format_time
from ..metrics import count_request
from .kinds import KINDS, Kind, kind_of
from .transport import LoopTransport

log = logging.getLogger("arbiter.kube")

# The User-Agent of every client new_api_client makes; with leader election it names this replica
# ("arbiter-operator/<identity>"), so the apiserver's audit log tells the replicas' requests apart.
USER_AGENT = "arbiter-operator"


# Events are aggregated like client-go's event correlator: a repeat of the same reason on the same object within
# SERIES_WINDOW joins the earlier Event (its count grows, its message and lastTimestamp are the latest) instead of
# posting another, and a series is written at most once per SERIES_WRITE_INTERVAL: repeats in between are counted in
# memory and go out with the next write. So a reason that repeats on every analysis poll (a canary waiting for
# traffic) costs one write a minute at most, not one per poll.
SERIES_WINDOW = 600.0
SERIES_WRITE_INTERVAL = 60.0


@dataclass
class EventSeries:
    name: str  # the Event object's name
    count: int
    message: str
    seen: float  # monotonic time of the latest occurrence
    written: float  # monotonic time of the latest write (POST or PATCH)
    written_count: int


# Seconds a request may take (connect, send, answer) before it fails.
REQUEST_TIMEOUT = 30.0

# The largest resourceVersion the apiserver parses (a uint64 that etcd's int64 revisions never reach): as a
# precondition it matches no existing object (RestKubeClient.create).
CREATE_ONLY_RESOURCE_VERSION = str(2**63 - 1)


Objects = list[dict[str, Any]]  # a LIST's items, by a name that a class defining `list` can use in its annotations


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotLeader(KubeError):
    """A write refused before it was sent: this replica does not hold the leader Lease (any more)."""


class KubeClient(Protocol):
    """What the operator needs from Kubernetes; tests may wrap it to count calls."""

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    def held(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """`get` of one of the operator's own children (or a DecisionModel): where a watch cache holds the kind, a
        miss is an answer (every such object carries the label the watch filters on); a plain client reads."""
        ...
    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]: ...
    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]: ...
    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]: ...
    def patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]: ...
    def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None) -> bool: ...
    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None: ...
    def served(self, api_version: str, kind: str) -> bool: ...


class LoopKubeClient(KubeClient, Protocol):
    """A KubeClient whose reads and writes may also be awaited on the operator's event loop: the observe and apply
    steps make their requests there, without a thread per request."""

    async def aget(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    async def aheld(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """`held`, awaited."""
        ...
    async def alist(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]: ...
    async def aapply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]: ...
    async def acreate(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def apatch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]: ...
    async def adelete(self, api_version: str, kind: str, namespace: str | None, name: str,
                      uid: str | None = None) -> bool: ...
    async def aevent(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None: ...
    async def apatch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]: ...
    async def aserved(self, api_version: str, kind: str) -> bool: ...


class Request(NamedTuple):
    """One request, as both the blocking and the awaitable method send it."""

    method: str
    path: str
    body: Any = None
    query: list[tuple[str, str]] | None = None
    content_type: str = "application/json"
    write: tuple[str, str, str] | None = None  # (verb, kind, ref) of a write: fenced and logged before it is sent


class RestKubeClient:
    def __init__(self, api_client: k8s.ApiClient | None = None, field_manager: str = FIELD_MANAGER,
                 fence: Callable[[], bool] | None = None, transport: LoopTransport | None = None):
        """transport: make the requests on the operator's event loop (aiokube); without one, or where it cannot be
        used (called on the loop's own thread, the loop stopped), through `api_client`."""
        if api_client is None:
            api_client = new_api_client()
        self.api = api_client
        self.field_manager = field_manager
        # With leader election: whether this replica still holds the leader Lease (leader.LeaderElector.is_leader).
        # Checked before every write, so a replica that lost the Lease (or never had it) writes nothing.
        self.fence = fence
        self.transport = transport
        # Transports of other event loops than `transport`'s (a test's, a tool's), made on first use there.
        self._transports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopTransport] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str, str, str], EventSeries] = {}  # (namespace, uid, type, reason)
        self.clock: Callable[[], float] = time.monotonic

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        if self.transport is not None and self.transport.usable():
            raw = _body_bytes(body)
            status, reason, answer = self.transport.call(method, path, raw, query or [], content_type, REQUEST_TIMEOUT)
            return answer_of(method, path, status, reason, answer)
        return raw_call(self.api, method, path, body, query, content_type)

    def _write(self, verb: str, kind: str, ref: str) -> None:
        if self.fence is not None and not self.fence():
            log.warning("write refused, not the leader: %s %s %s", verb, kind, ref)
            raise NotLeader(503, "NotLeader", f"{verb} {kind} {ref}: this replica does not hold the leader Lease")
        log.info("kube-write %s %s %s", verb, kind, ref)

    def _send(self, req: Request) -> dict[str, Any]:
        if req.write is not None:
            self._write(*req.write)
        return self._call(req.method, req.path, req.body, req.query, req.content_type)

    def _loop_transport(self) -> LoopTransport:
        """The transport of the running loop: the operator's, or one made here for another loop (no thread ever)."""
        here = asyncio.get_running_loop()
        if self.transport is not None and self.transport.loop is here:
            return self.transport
        transport = self._transports.get(here)
        if transport is None:
            transport = self._transports[here] = LoopTransport(self.api.configuration, here,
                                                               user_agent=self.api.user_agent)
        return transport

    async def _asend(self, req: Request) -> dict[str, Any]:
        """`_send`, awaited on the running loop: the request is made there, by that loop's transport."""
        transport = self._loop_transport()
        if req.write is not None:
            self._write(*req.write)
        data = _body_bytes(req.body)
        status, reason, answer = await transport.request(req.method, req.path, data, req.query or [],
                                                         req.content_type, REQUEST_TIMEOUT)
        return answer_of(req.method, req.path, status, reason, answer)

    # -- reads ----------------------------------------------------------------------------------------------------
    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self._send(Request("GET", kind_of(api_version, kind).path(namespace, name)))
        except KubeError as exc:
            _raise_unless_absent(exc)
            return None

    async def aget(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._asend(Request("GET", kind_of(api_version, kind).path(namespace, name)))
        except KubeError as exc:
            _raise_unless_absent(exc)
            return None

    def held(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """No cache here: a read (KubeClient.held)."""
        return self.get(api_version, kind, namespace, name)

    async def aheld(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return await self.aget(api_version, kind, namespace, name)

    def served(self, api_version: str, kind: str) -> bool:
        """Whether the apiserver serves this kind (API discovery, which every authenticated user may read: no RBAC
        grant on CRDs needed). Errors other than 404 raise: "cannot tell" is not "absent"."""
        try:
            out = self._send(_discovery_request(api_version))
        except KubeError as exc:
            return _not_served(exc)
        return _serves(out, kind_of(api_version, kind))

    async def aserved(self, api_version: str, kind: str) -> bool:
        try:
            out = await self._asend(_discovery_request(api_version))
        except KubeError as exc:
            return _not_served(exc)
        return _serves(out, kind_of(api_version, kind))

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        try:
            out = self._send(_list_request(api_version, kind, namespace, label_selector))
        except KubeError as exc:
            _raise_unless_absent(exc)  # the kind is not installed (e.g. no Route API outside OpenShift)
            return []
        return _items(out, api_version, kind)

    async def alist(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> Objects:
        try:
            out = await self._asend(_list_request(api_version, kind, namespace, label_selector))
        except KubeError as exc:
            _raise_unless_absent(exc)
            return []
        return _items(out, api_version, kind)

    # -- writes ---------------------------------------------------------------------------------------------------
    def _apply_request(self, obj: dict[str, Any], force: bool) -> Request:
        k = kind_of(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        query = [("fieldManager", self.field_manager)]
        if force:
            query.append(("force", "true"))
        ref = f"{meta.get('namespace', '')}/{meta['name']}"
        return Request("PATCH", k.path(meta.get("namespace"), meta["name"]), jsonfast.dumps(obj), query,
                       "application/apply-patch+yaml", ("apply", obj["kind"], ref))

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        return self._send(self._apply_request(obj, force))

    async def aapply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        return await self._asend(self._apply_request(obj, force))

    def _create_request(self, obj: dict[str, Any]) -> Request:
        """Server-side apply that only creates: KubeError 409 when an object of that name exists (whoever owns it),
        which is then left exactly as it was. The precondition is a resourceVersion no object can have (newer than
        any revision etcd hands out); the apiserver checks it against an existing object, in the same transaction
        as the write, and ignores it on a create. So the operator needs no read to learn that a name is free, and
        there is no window between a read and the write in which another owner's object could be overwritten."""
        k = kind_of(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        body = {**obj, "metadata": {**meta, "resourceVersion": CREATE_ONLY_RESOURCE_VERSION}}
        return Request("PATCH", k.path(meta.get("namespace"), meta["name"]), jsonfast.dumps(body),
                       [("fieldManager", self.field_manager)], "application/apply-patch+yaml",
                       ("create", obj["kind"], f"{meta.get('namespace', '')}/{meta['name']}"))

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self._send(self._create_request(obj))

    async def acreate(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._asend(self._create_request(obj))

    def _patch_status_request(self, api_version: str, kind: str, namespace: str, name: str,
                              patch: dict[str, Any]) -> Request:
        fields = ",".join(sorted((patch.get("status") or {}).keys()))
        return Request("PATCH", kind_of(api_version, kind).path(namespace, name, "status"), patch,
                       [("fieldManager", self.field_manager)], "application/merge-patch+json",
                       ("patch-status", kind, f"{namespace}/{name} [{fields}]"))

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self._send(self._patch_status_request(api_version, kind, namespace, name, patch))

    async def apatch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return await self._asend(self._patch_status_request(api_version, kind, namespace, name, patch))

    def patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        """A plain PATCH (e.g. a JSON patch of metadata.finalizers); never for children (they are applied)."""
        return self._send(self._patch_request(api_version, kind, namespace, name, body, content_type))

    async def apatch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        return await self._asend(self._patch_request(api_version, kind, namespace, name, body, content_type))

    def _patch_request(self, api_version: str, kind: str, namespace: str | None, name: str, body: Any,
                       content_type: str) -> Request:
        return Request("PATCH", kind_of(api_version, kind).path(namespace, name), body,
                       [("fieldManager", self.field_manager)], content_type,
                       ("patch", kind, f"{namespace or ''}/{name}"))

    @staticmethod
    def _delete_request(api_version: str, kind: str, namespace: str | None, name: str, uid: str | None) -> Request:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        return Request("DELETE", kind_of(api_version, kind).path(namespace, name), body,
                       write=("delete", kind, f"{namespace or ''}/{name}"))

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """uid: delete only that very object (a precondition: never one someone re-created under the name)."""
        try:
            self._send(self._delete_request(api_version, kind, namespace, name, uid))
        except KubeError as exc:
            return _not_deleted(exc, uid)
        return True

    async def adelete(self, api_version: str, kind: str, namespace: str | None, name: str,
                      uid: str | None = None) -> bool:
        try:
            await self._asend(self._delete_request(api_version, kind, namespace, name, uid))
        except KubeError as exc:
            return _not_deleted(exc, uid)
        return True

    async def aevent(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """`event`, awaited on the running loop."""
        noted = self._note_event(involved, type_, reason, message)
        if noted is None:
            return
        key, series, message = noted
        if series is not None:
            update = self._series_request(involved, series, reason)
            try:
                await self._asend(update)
            except NotLeader:
                raise
            except KubeError as exc:
                if self._series_failed(involved, exc, reason):
                    return
            else:
                series.written, series.written_count = self.clock(), series.count
                return
        post = self._event_request(involved, type_, reason, message)
        try:
            out: dict[str, Any] | None = await self._asend(post)
        except NotLeader:
            raise
        except KubeError as exc:  # an event is a courtesy: failing to post one must not fail the reconcile
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"]["name"], exc)
            out = None
        self._posted(key, out, message)

    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event on `involved`, or count it into the series of the same reason (see SERIES_WINDOW)."""
        noted = self._note_event(involved, type_, reason, message)
        if noted is None:
            return
        key, series, message = noted
        if series is not None:
            try:
                self._send(self._series_request(involved, series, reason))
            except NotLeader:
                raise
            except KubeError as exc:
                if self._series_failed(involved, exc, reason):
                    return
            else:
                series.written, series.written_count = self.clock(), series.count
                return
        try:
            out: dict[str, Any] | None = self._send(self._event_request(involved, type_, reason, message))
        except NotLeader:
            raise
        except KubeError as exc:
            log.warning("could not post event %s on %s: %s", reason, involved["metadata"]["name"], exc)
            out = None
        self._posted(key, out, message)

    def _note_event(self, involved: dict[str, Any], type_: str, reason: str,
                    message: str) -> tuple[tuple[str, str, str, str], EventSeries | None, str] | None:
        """Count one occurrence: None when it joins a series written moments ago (nothing to send now), else the
        series key, the series to write (None: post a new Event) and the message."""
        meta = involved["metadata"]
        message = message[:1024]
        key = (meta["namespace"], meta.get("uid") or meta["name"], type_, reason)
        now = self.clock()
        with self._lock:
            if len(self._series) > 10_000:  # forget series nobody repeated within the window
                self._series = {k: v for k, v in self._series.items() if now - v.seen <= SERIES_WINDOW}
            series = self._series.get(key)
            if series is not None and now - series.seen > SERIES_WINDOW:
                series = None
            if series is not None:
                series.count += 1
                series.message = message
                series.seen = now
                if now - series.written < SERIES_WRITE_INTERVAL:
                    log.debug("event %s on %s counted (%d), written with the series' next write", reason,
                              meta["name"], series.count)
                    return None
        return key, series, message

    @staticmethod
    def _series_request(involved: dict[str, Any], series: EventSeries, reason: str) -> Request:
        """A series' count and latest message written to its Event."""
        meta = involved["metadata"]
        stamp = format_time(datetime.now(UTC))
        return Request("PATCH", KINDS[(CORE_API, "Event")].path(meta["namespace"], series.name),
                       {"count": series.count, "message": series.message, "lastTimestamp": stamp},
                       content_type="application/merge-patch+json",
                       write=("event", "Event", f"{meta['namespace']}/{meta['name']} {reason} x{series.count}"))

    @staticmethod
    def _series_failed(involved: dict[str, Any], exc: KubeError, reason: str) -> bool:
        """After a failed series write: False when the Event is gone (expired: Events live an hour; or deleted) and a
        new one is to be posted instead."""
        if exc.status == 404:
            return False
        log.warning("could not update event %s on %s: %s", reason, involved["metadata"]["name"], exc)
        return True

    @staticmethod
    def _event_request(involved: dict[str, Any], type_: str, reason: str, message: str) -> Request:
        meta = involved["metadata"]
        body = event_body(involved, type_, reason, message, format_time(datetime.now(UTC)))
        return Request("POST", KINDS[(CORE_API, "Event")].path(meta["namespace"]), body,
                       write=("event", "Event", f"{meta['namespace']}/{meta['name']} {reason}"))

    def _posted(self, key: tuple[str, str, str, str], out: dict[str, Any] | None, message: str) -> None:
        name = ((out or {}).get("metadata") or {}).get("name")
        if name:
            now = self.clock()
            with self._lock:
                self._series[key] = EventSeries(name, 1, message, now, now, 1)


def event_body(involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> dict[str, Any]:
    """A new core/v1 Event on `involved` (its first occurrence, at `now`), as the operator posts it."""
    meta = involved["metadata"]
    return {
        "apiVersion": CORE_API,
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _body_bytes(body: Any) -> bytes:
    data = body if isinstance(body, (str, bytes)) or body is None else jsonfast.dumps(body)
    return data.encode() if isinstance(data, str) else (data or b"")


def _discovery_request(api_version: str) -> Request:
    return Request("GET", "/api/v1" if api_version == CORE_API else f"/apis/{api_version}")


def _not_served(exc: KubeError) -> bool:
    """Discovery's 404 means "not served"; any other error raises: "cannot tell" is not "absent"."""
    if exc.status == 404:
        return False
    raise exc


def _serves(out: dict[str, Any], k: Kind) -> bool:
    return any(r.get("name") == k.plural for r in (out or {}).get("resources") or [] if isinstance(r, dict))


def _list_request(api_version: str, kind: str, namespace: str | None, label_selector: str | None) -> Request:
    query = [("labelSelector", label_selector)] if label_selector else []
    return Request("GET", kind_of(api_version, kind).path(namespace), query=query)


def _items(out: dict[str, Any], api_version: str, kind: str) -> list[dict[str, Any]]:
    items = out.get("items") or []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise KubeError(502, "BadResponse", f"the answer to a LIST of {kind} holds items that are not objects")
    for item in items:  # list items come without apiVersion/kind
        item.setdefault("apiVersion", api_version)
        item.setdefault("kind", kind)
    return items


def _raise_unless_absent(exc: KubeError) -> None:
    """A GET's 404 is an answer (no such object); any other error is raised."""
    if exc.status != 404:
        raise exc


def _not_deleted(exc: KubeError, uid: str | None) -> bool:
    """A DELETE's 404 (already gone) or failed uid precondition (another object now, not ours to delete) is False;
    any other error is raised."""
    if exc.status == 404 or (exc.status == 409 and uid):
        return False
    raise exc


def raw_call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str = "application/json",
    timeout: float = REQUEST_TIMEOUT,
) -> dict[str, Any]:
    """One REST call; returns the decoded JSON object, raises KubeError for a non-2xx answer or one that is not a
    JSON object."""
    method_, url, headers, body_, post = api.param_serialize(
        method,
        path,
        query_params=query or [],
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    try:
        resp = api.call_api(method_, url, header_params=headers, body=body_, post_params=post,
                            _request_timeout=timeout)
    except Exception:
        count_request(method, None)
        raise
    count_request(method, resp.status)
    return answer_of(method, path, resp.status, resp.reason or "", resp.read())


def answer_of(method: str, path: str, status: int, reason: str, data: bytes | None) -> dict[str, Any]:
    """An answer as the decoded object (2xx), else KubeError with the apiserver's reason and message."""
    if not 200 <= status < 300:
        message = ""
        try:
            payload = jsonfast.loads(data or b"{}")
            message = payload.get("message", "") if isinstance(payload, dict) else ""
            reason = payload.get("reason", reason) if isinstance(payload, dict) else reason
        except (ValueError, RecursionError):
            message = (data or b"")[:200].decode(errors="replace")
        raise KubeError(status, str(reason)[:200], str(message)[:1000])
    # The apiserver answers every request the operator makes with an object (the object, a list, a Status). Anything
    # else (a proxy's page, a cut answer, nothing) means the object did not arrive: an error the reconcile retries.
    try:
        # A write's answer goes to the watch cache, which holds no managedFields: they are not even decoded. A read's
        # answer comes whole (an object of another owner is described by its field managers).
        out = jsonfast.loads(data or b"") if method == "GET" else kubejson.loads_object(data or b"")
    except (ValueError, RecursionError):  # UnicodeError included; RecursionError: nesting deeper than Python's stack
        out = None
    if not isinstance(out, dict):
        head = (data or b"")[:80]
        raise KubeError(502, "BadResponse", f"the answer to {method} {path} is not a JSON object: {head!r}")
    return out


# Connections kept open to the apiserver: one per worker and I/O thread (app.DEFAULT_WORKERS + 4) and spare.
# The kubernetes library keeps 5 per CPU; with more threads than that, the surplus connections were closed after use
# ("Connection pool is full, discarding connection") and later requests paid a new TLS handshake.
CONNECTIONS = 32


def new_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            raise k8s_config.ConfigException("explicit kubeconfig")
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, CONNECTIONS)
    api = k8s.ApiClient(configuration)
    api.user_agent = USER_AGENT
    return api
