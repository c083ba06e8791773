"""A small Kubernetes client: get, list, server-side apply, status patch, delete, events. No logic.

Raw REST on the running event loop (kube/transport.py: aiohttp; no discovery round-trips, one code path for built-in
and custom kinds). Every verb is awaited: the operator's reconcile runs on its event loop, and so do the tools and
tests that use this client. Every mutating call is logged with the `kube-write` prefix (nothing is kept in memory),
so tests can prove from the log that a converged reconcile writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import jsonfast, kubejson
from ..api.names import CORE_API, FIELD_MANAGER
from ..api.times import format_time
from .events import EventBook, EventSeries, event_body, series_patch
from .kinds import KINDS, Kind, kind_of
from .transport import LoopTransport

log = logging.getLogger("arbiter.kube")

# The User-Agent of every client new_api_client makes; with leader election it names this replica
# ("arbiter-operator/<identity>"), so the apiserver's audit log tells the replicas' requests apart.
USER_AGENT = "arbiter-operator"

# Seconds a request may take (connect, send, answer) before it fails.
REQUEST_TIMEOUT = 30.0

# The largest resourceVersion the apiserver parses (a uint64 that etcd's int64 revisions never reach): as a
# precondition it matches no existing object (RestKubeClient.acreate).
CREATE_ONLY_RESOURCE_VERSION = str(2**63 - 1)


Objects = list[dict[str, Any]]  # a LIST's items


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotLeader(KubeError):
    """A write refused before it was sent: this replica does not hold the leader Lease (any more)."""


class KubeClient(Protocol):
    """Every verb the operator uses on Kubernetes, each awaited on the running event loop. The `a` prefix says so at
    every call site (and keeps `alist` clear of the builtin `list` in a class body)."""

    async def aget(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    async def aheld(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """`aget` of one of the operator's own children (or a DecisionModel): where a watch cache holds the kind, a
        miss is an answer (every such object carries the label the watch filters on); a plain client reads."""
        ...
    async def alist(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> Objects: ...
    async def afresh(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A GET from the apiserver whatever a cache holds: the object whole, managedFields included."""
        ...
    async def aapply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]: ...
    async def acreate(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def apatch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]: ...
    async def apatch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]: ...
    async def adelete(self, api_version: str, kind: str, namespace: str | None, name: str,
                      uid: str | None = None) -> bool: ...
    async def aevent(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None: ...
    async def aserved(self, api_version: str, kind: str) -> bool: ...


class Request(NamedTuple):
    """One request, as a verb builds it."""

    method: str
    path: str
    body: Any = None
    query: list[tuple[str, str]] | None = None
    content_type: str = "application/json"
    write: tuple[str, str, str] | None = None  # (verb, kind, ref) of a write: fenced and logged before it is sent


class RestKubeClient:
    def __init__(self, api_client: k8s.ApiClient | None = None, field_manager: str = FIELD_MANAGER,
                 fence: Callable[[], bool] | None = None, transport: LoopTransport | None = None):
        """api_client: the credentials (its configuration) and User-Agent; its own HTTP stack is never used.
        transport: the operator's, used on its loop; on another loop (a test's, a tool's) one is made there."""
        if api_client is None:
            api_client = new_api_client()
        self.api = api_client
        self.field_manager = field_manager
        # With leader election: whether this replica still holds the leader Lease (leader.LeaderElector.is_leader).
        # Checked before every write, so a replica that lost the Lease (or never had it) writes nothing.
        self.fence = fence
        self.transport = transport
        # Transports of other event loops than `transport`'s, made on first use there.
        self._transports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopTransport] = \
            weakref.WeakKeyDictionary()
        self.events = EventBook()

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _fenced(self, verb: str, kind: str, ref: str) -> None:
        if self.fence is not None and not self.fence():
            log.warning("write refused, not the leader: %s %s %s", verb, kind, ref)
            raise NotLeader(503, "NotLeader", f"{verb} {kind} {ref}: this replica does not hold the leader Lease")
        log.info("kube-write %s %s %s", verb, kind, ref)

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

    async def close(self) -> None:
        """Close the transport this client made for the running loop (the operator's own is closed by its owner)."""
        transport = self._transports.pop(asyncio.get_running_loop(), None)
        if transport is not None:
            await transport.close()

    async def _asend(self, req: Request) -> dict[str, Any]:
        """One request on the running loop, by that loop's transport: the decoded answer, or KubeError."""
        transport = self._loop_transport()
        if req.write is not None:
            self._fenced(*req.write)
        status, reason, answer = await transport.request(req.method, req.path, _body_bytes(req.body), req.query or [],
                                                         req.content_type, REQUEST_TIMEOUT)
        return answer_of(req.method, req.path, status, reason, answer)

    # -- reads ----------------------------------------------------------------------------------------------------
    async def aget(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._asend(Request("GET", kind_of(api_version, kind).path(namespace, name)))
        except KubeError as exc:
            _raise_unless_absent(exc)
            return None

    async def aheld(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """No cache here: a read (KubeClient.aheld)."""
        return await self.aget(api_version, kind, namespace, name)

    async def afresh(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """No cache here: a read (KubeClient.afresh)."""
        return await self.aget(api_version, kind, namespace, name)

    async def aserved(self, api_version: str, kind: str) -> bool:
        """Whether the apiserver serves this kind (API discovery, which every authenticated user may read: no RBAC
        grant on CRDs needed). Errors other than 404 raise: "cannot tell" is not "absent"."""
        path = "/api/v1" if api_version == CORE_API else f"/apis/{api_version}"
        try:
            out = await self._asend(Request("GET", path))
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return _serves(out, kind_of(api_version, kind))

    async def alist(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> Objects:
        query = [("labelSelector", label_selector)] if label_selector else []
        try:
            out = await self._asend(Request("GET", kind_of(api_version, kind).path(namespace), query=query))
        except KubeError as exc:
            _raise_unless_absent(exc)  # the kind is not installed (e.g. no Route API outside OpenShift)
            return []
        return _items(out, api_version, kind)

    # -- writes ---------------------------------------------------------------------------------------------------
    async def aapply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        k = kind_of(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        query = [("fieldManager", self.field_manager)]
        if force:
            query.append(("force", "true"))
        ref = f"{meta.get('namespace', '')}/{meta['name']}"
        return await self._asend(Request("PATCH", k.path(meta.get("namespace"), meta["name"]), jsonfast.dumps(obj),
                                         query, "application/apply-patch+yaml", ("apply", obj["kind"], ref)))

    async def acreate(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply that only creates: KubeError 409 when an object of that name exists (whoever owns it),
        which is then left exactly as it was. The precondition is a resourceVersion no object can have (newer than
        any revision etcd hands out); the apiserver checks it against an existing object, in the same transaction
        as the write, and ignores it on a create. So the operator needs no read to learn that a name is free, and
        there is no window between a read and the write in which another owner's object could be overwritten."""
        k = kind_of(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        body = {**obj, "metadata": {**meta, "resourceVersion": CREATE_ONLY_RESOURCE_VERSION}}
        return await self._asend(Request(
            "PATCH", k.path(meta.get("namespace"), meta["name"]), jsonfast.dumps(body),
            [("fieldManager", self.field_manager)], "application/apply-patch+yaml",
            ("create", obj["kind"], f"{meta.get('namespace', '')}/{meta['name']}")))

    async def apatch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        fields = ",".join(sorted((patch.get("status") or {}).keys()))
        return await self._asend(Request(
            "PATCH", kind_of(api_version, kind).path(namespace, name, "status"), patch,
            [("fieldManager", self.field_manager)], "application/merge-patch+json",
            ("patch-status", kind, f"{namespace}/{name} [{fields}]")))

    async def apatch(
        self, api_version: str, kind: str, namespace: str | None, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        """A plain PATCH (e.g. a JSON patch of metadata.finalizers); never for children (they are applied)."""
        return await self._asend(Request(
            "PATCH", kind_of(api_version, kind).path(namespace, name), body, [("fieldManager", self.field_manager)],
            content_type, ("patch", kind, f"{namespace or ''}/{name}")))

    async def adelete(self, api_version: str, kind: str, namespace: str | None, name: str,
                      uid: str | None = None) -> bool:
        """uid: delete only that very object (a precondition: never one someone re-created under the name). False
        when it is already gone, or (uid) another object holds the name now: not ours to delete."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._asend(Request("DELETE", kind_of(api_version, kind).path(namespace, name), body,
                                      write=("delete", kind, f"{namespace or ''}/{name}")))
        except KubeError as exc:
            if exc.status == 404 or (exc.status == 409 and uid):
                return False
            raise
        return True

    # -- events ---------------------------------------------------------------------------------------------------
    async def aevent(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event on `involved`, or count it into the series of the same reason (kube/events.py). An Event is
        a courtesy: an apiserver's refusal is logged, never raised (but NotLeader: a standby writes nothing)."""
        occurrence = self.events.note(involved, type_, reason, message)
        if occurrence is None:
            return
        if occurrence.series is not None and await self._write_series(involved, occurrence.series, reason):
            return
        meta = involved["metadata"]
        body = event_body(involved, type_, reason, occurrence.message, format_time(datetime.now(UTC)))
        try:
            out: dict[str, Any] | None = await self._asend(Request(
                "POST", KINDS[(CORE_API, "Event")].path(meta["namespace"]), body,
                write=("event", "Event", f"{meta['namespace']}/{meta['name']} {reason}")))
        except NotLeader:
            raise
        except KubeError as exc:
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc)
            out = None
        self.events.posted(occurrence.key, out, occurrence.message)

    async def _write_series(self, involved: dict[str, Any], series: EventSeries, reason: str) -> bool:
        """Write a series' count to its Event: False when the Event is gone (expired: Events live an hour; or
        deleted) and a new one is to be posted instead."""
        meta = involved["metadata"]
        try:
            await self._asend(Request(
                "PATCH", KINDS[(CORE_API, "Event")].path(meta["namespace"], series.name),
                series_patch(series, format_time(datetime.now(UTC))), content_type="application/merge-patch+json",
                write=("event", "Event", f"{meta['namespace']}/{meta['name']} {reason} x{series.count}")))
        except NotLeader:
            raise
        except KubeError as exc:
            if exc.status == 404:
                return False
            log.warning("could not update event %s on %s: %s", reason, meta["name"], exc)
            return True
        self.events.written(series)
        return True


def _body_bytes(body: Any) -> bytes:
    data = body if isinstance(body, (str, bytes)) or body is None else jsonfast.dumps(body)
    return data.encode() if isinstance(data, str) else (data or b"")


def _serves(out: dict[str, Any], k: Kind) -> bool:
    """Whether a discovery answer (always an object: answer_of) lists the kind's resource."""
    resources = out.get("resources")
    return isinstance(resources, list) and any(isinstance(r, dict) and r.get("name") == k.plural for r in resources)


def _items(out: dict[str, Any], api_version: str, kind: str) -> Objects:
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


def new_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config). Only its
    configuration (the credentials) and User-Agent are used: every request goes through kube/transport.py."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            raise k8s_config.ConfigException("explicit kubeconfig")
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    api = k8s.ApiClient(configuration)
    api.user_agent = USER_AGENT
    return api
