"""The watch cache: the objects the operator's watches deliver, kept in memory, so that a reconcile reads its
DecisionModel and children without asking the apiserver (docs/architecture.md, "Reads from the watch cache").

The watches fill it: kube/watch.py's for DecisionModels and children (triggers.Triggers; no pass runs before every
kind's first list is held), so no reconcile ever sees a half-filled cache. The operator's own writes go in too
(write-through) with the object the apiserver answered, so the next reconcile sees what it just wrote even before the
watch echoes it; a watch event older than what is held (by resourceVersion) never replaces it. The echo of a write
is recognised (`is_echo`) so it does not queue another reconcile.

`CachedKubeClient` wraps the REST client. A `get` of a cached kind is answered from here when the object is held, and
(but for DecisionModels, which are watched unfiltered, so a miss is an answer) from the apiserver when it is not
(the watches of children hold only objects that bear the operator's label, so a
miss may be another owner's object or a CA bundle ConfigMap: only the apiserver can say). A `list` of a cached kind
is answered from here when its selector pins the label the watch filters on. Writes and Secrets always go to the
apiserver.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Awaitable
from typing import Any, NamedTuple

import msgspec

from ..api import jsonfast
from ..api.kubejson import REFUSED, refused
from .client import KubeClient, Objects
from .kinds import STATUS_ONLY

Key = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))


def _rv(obj: dict[str, Any] | None) -> int | None:
    return _rv_of(((obj or {}).get("metadata") or {}).get("resourceVersion"))


def _rv_of(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """What the reconcile reads of an object: everything but managedFields, kubectl's copy of the last applied spec
    and, for STATUS_ONLY kinds, the spec (the largest parts; managedFields are read only for objects of other owners,
    which come from the apiserver)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status_only = obj.get("kind") in STATUS_ONLY and "spec" in obj
    if "managedFields" not in meta and LAST_APPLIED not in annotations and not status_only:
        return obj
    out = {k: v for k, v in obj.items() if not (status_only and k == "spec")}
    out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    if LAST_APPLIED in annotations:
        out["metadata"]["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return out


_EQ = re.compile(r"^\s*([^\s=!,()]+)\s*(==?|!=)\s*([^\s,()]*)\s*$")
_IN = re.compile(r"^\s*([^\s=!,()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _requirements(selector: str) -> list[tuple[str, str, set[str]]] | None:
    """A label selector as (key, op, values); None when it uses a form this parser does not know."""
    parts = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    out: list[tuple[str, str, set[str]]] = []
    for part in parts:
        if not part.strip():
            continue
        if m := _IN.match(part):
            out.append((m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}))
        elif m := _EQ.match(part):
            out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", {m.group(3)}))
        else:
            return None
    return out


def matches(labels: dict[str, str], reqs: list[tuple[str, str, set[str]]]) -> bool:
    for key, op, values in reqs:
        if op in ("=", "in") and labels.get(key) not in values:
            return False
        if op in ("!=", "notin") and key in labels and labels[key] in values:
            return False
    return True


_encode = msgspec.json.Encoder().encode


def _held_bytes(obj: dict[str, Any]) -> bytes:
    """Compact JSON of an object to hold. msgspec: about ten times faster than the standard library's encoder (which
    was a few percent of the operator's CPU at fleet scale), and its bytes are exactly as long as the text (orjson's
    were measured to hold about 65 MiB more at 1,000 DecisionModels: its output buffers). The standard library for
    what msgspec refuses (integers beyond 64 bits). An object nested too deep for either is held as a stand-in
    (`api.kubejson.refused`: its metadata and why), which the reconcile reports."""
    try:
        try:
            return _encode(obj)
        except (TypeError, ValueError, OverflowError):
            return json.dumps(obj, separators=(",", ":")).encode()
    except RecursionError as exc:
        stand_in: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "status") if k in obj}
        stand_in[REFUSED] = f"it is nested too deep to hold ({exc})"
        try:
            return _encode(stand_in)
        except RecursionError:  # a status nested that deep too: the metadata, which the apiserver keeps shallow
            stand_in.pop("status", None)
            return _encode(stand_in)


class _Held(NamedTuple):
    rv: int | None
    uid: str | None
    labels: dict[str, str]
    data: bytes  # the object as compact JSON: a third or less of the memory of the parsed dicts, and each read
    # parses its own copy (no caller can change what is held)


class WatchCache:
    """Objects by (apiVersion, kind, namespace, name) for the kinds whose watches fill it. Thread-safe: the watches
    run on the operator's event loop, reconciles read from worker threads."""

    def __init__(self, kinds: dict[tuple[str, str], str | None] | None = None) -> None:
        # (apiVersion, kind) -> the label every held object of that kind carries (the watch's filter), or None.
        # Namespaces are held too (kube/namespaces.py fills them) but are not listed here: a namespace not yet
        # watched is read.
        self.kinds: dict[tuple[str, str], str | None] = dict(kinds or {})
        self._objs: dict[Key, _Held] = {}
        self._by_ns: dict[tuple[str, str, str], set[str]] = {}
        self._written: dict[Key, int | None] = {}  # resourceVersion of the operator's last write to each object
        self._in_flight: dict[Key, int] = {}  # objects with a write sent and not answered yet (how many)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._objs)

    def put(self, obj: dict[str, Any]) -> None:
        """Hold `obj` unless what is held is newer or the same. resourceVersions are opaque to clients in general,
        but every apiserver backed by etcd hands out its revision, an increasing integer; when either is not an
        integer, the later arrival wins."""
        key = _key(obj)
        rv = _rv(obj)
        held = self._objs.get(key)
        if held is not None and rv is not None and held.rv is not None and rv <= held.rv:
            # Older, or the very object held: one resourceVersion is one state of one object (the echo of the
            # operator's own write, whose answer is held already, is most of these; encoding it again is wasted).
            return
        slim = _slim(obj)
        labels = dict((slim.get("metadata") or {}).get("labels") or {})
        entry = _Held(rv, (obj.get("metadata") or {}).get("uid"), labels, _held_bytes(slim))
        with self._lock:
            held = self._objs.get(key)
            if held is not None and rv is not None and held.rv is not None and rv <= held.rv:
                return
            self._objs[key] = entry
            self._by_ns.setdefault(key[:3], set()).add(key[3])

    def discard(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None) -> None:
        """Forget an object. uid: only that very object (a deletion event of an earlier object of the same name must
        not take the one created since, e.g. a candidate redeployed under its name)."""
        key = (api_version, kind, namespace or "", name)
        with self._lock:
            held = self._objs.get(key)
            if uid and held is not None and held.uid and held.uid != uid:
                return
            self._objs.pop(key, None)
            self._written.pop(key, None)
            names = self._by_ns.get(key[:3])
            if names is not None:
                names.discard(name)

    def wrote(self, obj: dict[str, Any] | None) -> None:
        """The apiserver's answer to one of the operator's writes: hold it, and know its watch event as an echo."""
        if not obj or not (obj.get("metadata") or {}).get("name"):
            return
        if (obj.get("apiVersion"), obj.get("kind")) not in self.kinds:
            return
        self.put(obj)
        with self._lock:
            self._written[_key(obj)] = _rv(obj)

    def begin_write(self, key: Key) -> None:
        with self._lock:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def end_write(self, key: Key, answer: dict[str, Any] | None) -> None:
        """The write to `key` got its answer (None: it failed): hold it, then let `is_echo` judge that object's
        events again."""
        try:
            self.wrote(answer)
        finally:
            with self._lock:
                n = self._in_flight.get(key, 0) - 1
                if n > 0:
                    self._in_flight[key] = n
                else:
                    self._in_flight.pop(key, None)

    def writing(self, obj: dict[str, Any]) -> bool:
        """Whether a write of the operator's to this object is still waiting for its answer: its watch event may
        arrive first, and can only be judged an echo (or not) once the answer's resourceVersion is known."""
        return _key(obj) in self._in_flight

    def is_echo(self, obj: dict[str, Any]) -> bool:
        """Whether this watch event carries exactly the object the operator's own last write produced (nothing
        anybody else did since): reconciling for it would find nothing new."""
        return self._wrote_at(_key(obj), _rv(obj))

    def _wrote_at(self, key: Key, rv: int | None) -> bool:
        with self._lock:
            return rv is not None and self._written.get(key) == rv

    def holds_version(self, key: Key, resource_version: str) -> bool:
        """Whether the object held under `key` is at exactly that resourceVersion (read as `put` reads them)."""
        held = self._objs.get(key)
        return held is not None and held.rv is not None and held.rv == _rv_of(resource_version)

    def wrote_version(self, key: Key, resource_version: str) -> bool:
        """`is_echo` for an object known by its key and resourceVersion only."""
        return self._wrote_at(key, _rv_of(resource_version))

    def holds(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        return (api_version, kind, namespace or "", name) in self._objs

    def labels(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, str] | None:
        """The labels of a held object (None: not held), without decoding it."""
        held = self._objs.get((api_version, kind, namespace or "", name))
        return dict(held.labels) if held is not None else None

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        held = self._objs.get((api_version, kind, namespace or "", name))
        return _read(held.data) if held is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None,
             reqs: list[tuple[str, str, set[str]]]) -> list[dict[str, Any]]:
        with self._lock:
            if namespace:
                names = self._by_ns.get((api_version, kind, namespace), set())
                held = [self._objs[(api_version, kind, namespace, n)] for n in sorted(names)]
            else:
                held = [h for k, h in sorted(self._objs.items()) if k[:2] == (api_version, kind)]
        return [_read(h.data) for h in held if matches(h.labels, reqs)]


def _read(data: bytes) -> dict[str, Any]:
    """A held object, parsed; a stand-in (`api.kubejson.refused`) where it nests deeper than orjson reads (a watch
    line's decoder, msgspec, goes as deep as Python's recursion limit lets it, which may be deeper)."""
    try:
        out: dict[str, Any] = jsonfast.loads(data)
        return out
    except (ValueError, RecursionError) as exc:
        stand_in = refused(data, f"it is nested too deep to read ({exc})")
        if stand_in is None:  # what was held was encoded from a decoded object: it has metadata
            raise
        return stand_in


class CachedKubeClient:
    """A KubeClient whose reads of cached kinds come from the watch cache; writes go through and are written back.
    Every verb is defined here (none reaches the wrapped client unseen), so every write goes through the cache's
    bookkeeping."""

    def __init__(self, inner: KubeClient, cache: WatchCache) -> None:
        self.inner = inner
        self.cache = cache

    def _answered(self, api_version: str, kind: str, namespace: str | None, name: str,
                  own_child: bool = False) -> tuple[bool, dict[str, Any] | None]:
        """(whether the cache answers a GET, its answer). A miss is an absence for a kind watched unfiltered
        (DecisionModels: the cache holds every one) and, with `own_child`, for every cached kind (the operator's own
        children all bear the label its watches filter on)."""
        held = self.cache.get(api_version, kind, namespace, name)
        if held is not None:
            return True, held
        cached = (api_version, kind) in self.cache.kinds
        return cached and (own_child or self.cache.kinds[(api_version, kind)] is None), None

    def _list_requirements(self, api_version: str, kind: str,
                           label_selector: str | None) -> list[tuple[str, str, set[str]]] | None:
        """The selector's requirements when the cache answers this LIST (its kind is held and the selector pins the
        label the watch filters on), else None."""
        reqs = _requirements(label_selector or "")
        if (api_version, kind) in self.cache.kinds and reqs is not None:
            label = self.cache.kinds[(api_version, kind)]
            if label is None or any(k == label and op in ("=", "in") for k, op, _ in reqs):
                return reqs
        return None

    async def _awrite(self, key: Key, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        self.cache.begin_write(key)
        out = None
        try:
            out = await call
            return out
        finally:
            self.cache.end_write(key, out)

    async def aget(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        answered, held = self._answered(api_version, kind, namespace, name)
        return held if answered else await self.inner.aget(api_version, kind, namespace, name)

    async def aheld(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Like `aget`, but a miss of a cached kind is an answer (None), not a read: for the operator's own children,
        which all bear the label the watch filters on."""
        answered, held = self._answered(api_version, kind, namespace, name, own_child=True)
        return held if answered else await self.inner.aget(api_version, kind, namespace, name)

    async def afresh(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return await self.inner.afresh(api_version, kind, namespace, name)

    async def alist(self, api_version: str, kind: str, namespace: str | None,
                    label_selector: str | None = None) -> Objects:
        reqs = self._list_requirements(api_version, kind, label_selector)
        if reqs is not None:
            return self.cache.list(api_version, kind, namespace, reqs)
        return await self.inner.alist(api_version, kind, namespace, label_selector)

    async def aapply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        return await self._awrite(_key(obj), self.inner.aapply(obj, force=force))

    async def acreate(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._awrite(_key(obj), self.inner.acreate(obj))

    async def apatch_status(self, api_version: str, kind: str, namespace: str, name: str,
                            patch: dict[str, Any]) -> dict[str, Any]:
        return await self._awrite((api_version, kind, namespace or "", name),
                                  self.inner.apatch_status(api_version, kind, namespace, name, patch))

    async def adelete(self, api_version: str, kind: str, namespace: str | None, name: str,
                      uid: str | None = None) -> bool:
        out = await self.inner.adelete(api_version, kind, namespace, name, uid=uid)
        self.cache.discard(api_version, kind, namespace, name)
        return out

    async def apatch(self, api_version: str, kind: str, namespace: str | None, name: str, body: Any,
                     content_type: str) -> dict[str, Any]:
        return await self._awrite((api_version, kind, namespace or "", name),
                                  self.inner.apatch(api_version, kind, namespace, name, body, content_type))

    async def aevent(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self.inner.aevent(involved, type_, reason, message)

    async def aserved(self, api_version: str, kind: str) -> bool:
        return await self.inner.aserved(api_version, kind)
