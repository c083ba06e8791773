"""Kubernetes objects decoded as the operator holds them: without `metadata.managedFields` and, for the kinds whose
spec it never reads (Deployments and pods: only their status tells it anything), without the spec.

The decoder skips those parts while it parses (msgspec, typed): they are never built as Python objects. managedFields
are most of a watched object's bytes, and building them, only for the watch cache to drop them, was the largest
share of the operator's CPU at fleet scale. The operator reads managedFields only of objects of other owners
(`apply.describe_owner`), which it GETs from the apiserver whole.

Kept: apiVersion, kind, metadata (every ObjectMeta field but managedFields), spec, status, and a ConfigMap's data,
binaryData and immutable (of a Deployment or a pod: apiVersion, kind, metadata and status); any other top-level field
is dropped (no kind the operator watches or writes has one).
A field that is present is kept exactly as sent (null included), whatever its type: validating it is the caller's
job, as with a generic decode. Anything the typed decoder refuses (a metadata or an object that is not a JSON
object, a number out of range) is decoded generically, so the caller's own checks decide, as before.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

UNSET: Any = msgspec.UNSET


class _Meta(msgspec.Struct):
    name: Any = UNSET
    generateName: Any = UNSET
    namespace: Any = UNSET
    selfLink: Any = UNSET
    uid: Any = UNSET
    resourceVersion: Any = UNSET
    generation: Any = UNSET
    creationTimestamp: Any = UNSET
    deletionTimestamp: Any = UNSET
    deletionGracePeriodSeconds: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET
    ownerReferences: Any = UNSET
    finalizers: Any = UNSET


class _StatusOnly(msgspec.Struct):
    apiVersion: Any = UNSET
    kind: Any = UNSET
    metadata: _Meta | msgspec.UnsetType = UNSET
    status: Any = UNSET


class _Whole(_StatusOnly):
    spec: Any = UNSET
    data: Any = UNSET
    binaryData: Any = UNSET
    immutable: Any = UNSET


class _WatchEvent(msgspec.Struct):
    type: Any = UNSET
    object: _Whole | msgspec.UnsetType = UNSET


class _StatusOnlyEvent(msgspec.Struct):
    type: Any = UNSET
    object: _StatusOnly | msgspec.UnsetType = UNSET


class _HeadMeta(msgspec.Struct):
    name: Any = UNSET
    namespace: Any = UNSET
    resourceVersion: Any = UNSET


class _HeadObject(msgspec.Struct):
    metadata: _HeadMeta | msgspec.UnsetType = UNSET


class _HeadEvent(msgspec.Struct):
    type: Any = UNSET
    object: _HeadObject | msgspec.UnsetType = UNSET


_HEAD = msgspec.json.Decoder(_HeadEvent)


def event_head(line: bytes) -> tuple[str, str, str, str] | None:
    """(type, namespace, name, resourceVersion) of one watch line, built without the rest of the object (the decoder
    only steps over it, a few times faster than decoding it); None where the line has no such four strings."""
    try:
        event = _HEAD.decode(line)
    except (ValueError, RecursionError):  # msgspec's DecodeError and ValidationError are ValueErrors
        return None
    obj = event.object
    if isinstance(obj, msgspec.UnsetType) or isinstance(obj.metadata, msgspec.UnsetType):
        return None
    meta = obj.metadata
    type_, namespace, name, rv = event.type, meta.namespace, meta.name, meta.resourceVersion
    if isinstance(type_, str) and isinstance(namespace, str) and isinstance(name, str) and isinstance(rv, str):
        return type_, namespace, name, rv
    return None


_OBJECT: dict[bool, msgspec.json.Decoder[Any]] = {
    True: msgspec.json.Decoder(_StatusOnly), False: msgspec.json.Decoder(_Whole)}
_EVENT: dict[bool, msgspec.json.Decoder[Any]] = {
    True: msgspec.json.Decoder(_StatusOnlyEvent), False: msgspec.json.Decoder(_WatchEvent)}
_WHOLE_FIELDS = _Whole.__struct_fields__
_META_FIELDS = _Meta.__struct_fields__


def _to_builtins(obj: _StatusOnly) -> dict[str, Any]:
    """A decoded object as plain dicts. Only the object and its metadata are Structs (every field below them is
    decoded as plain values already), so two small dicts are built here; msgspec.to_builtins would walk the whole
    spec and status again to find nothing to convert (a quarter of the decoding time)."""
    out = {}
    for name in _WHOLE_FIELDS if isinstance(obj, _Whole) else _StatusOnly.__struct_fields__:
        value = getattr(obj, name)
        if value is not UNSET:
            out[name] = value
    meta = out.get("metadata")
    if meta is not None:
        held = {}
        for name in _META_FIELDS:
            value = getattr(meta, name)
            if value is not UNSET:
                held[name] = value
        out["metadata"] = held
    return out


def loads_object(data: bytes, status_only: bool = False) -> Any:
    """One object (an apiserver's answer to a write) without managedFields (and without the spec when `status_only`:
    a kind whose spec the operator never reads, kube/kinds.py STATUS_ONLY). Raises ValueError (or RecursionError)
    where `data` is not JSON."""
    try:
        return _to_builtins(_OBJECT[status_only].decode(data))
    except msgspec.ValidationError:  # JSON, but not shaped like an object: as a generic decode sees it
        return orjson.loads(data)


def loads_event(line: bytes, status_only: bool = False) -> tuple[Any, Any] | None:
    """(type, object) of one watch line, the object slimmed as `loads_object` does; None where the line is not a JSON
    object. An ERROR event's object (a Status) comes whole."""
    try:
        event = _EVENT[status_only].decode(line)
        if event.type != "ERROR":
            obj = event.object
            return event.type, None if obj is UNSET else _to_builtins(obj)
        doc = orjson.loads(line)
    except msgspec.ValidationError:
        try:
            doc = orjson.loads(line)
        except ValueError:
            return None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested deeper than the parser goes
        return None
    return (doc.get("type"), doc.get("object")) if isinstance(doc, dict) else None
