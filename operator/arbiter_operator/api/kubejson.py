"""Kubernetes objects decoded as the operator holds them: without `metadata.managedFields` and, for the kinds whose
spec it never reads (Deployments and pods: only their status tells it anything), without the spec.

The decoder skips those parts while it parses (msgspec, typed): they are never built as Python objects. managedFields
are most of a watched object's bytes, and building them, only for the watch cache to drop them, was the largest
share of the operator's CPU at fleet scale. The operator reads managedFields only of objects of other owners
(`apply.describe_owner`), which it GETs from the apiserver whole.

An object the decoders cannot build (nested deeper than they go) is held as a stand-in (`refused`): its apiVersion,
kind and metadata, found by `api.jsonscan` and decoded alone, and REFUSED, the decoder's reason. The reconcile writes
its status from that; no list, watch or write answer fails for it.

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

from . import jsonscan

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


# The key of a stand-in's reason: no Kubernetes object has it (their top-level fields are camelCase words).
REFUSED = "@refused"


def refused(data: bytes, reason: str, start: int = 0, end: int | None = None) -> dict[str, Any] | None:
    """A stand-in for the object in data[start:end] that could not be decoded: its apiVersion and kind (where they
    are strings), its metadata without managedFields, its status where that decodes, and REFUSED: `reason`; None
    where the object has no metadata that decodes as an object (nothing names it: the answer, not one object, is
    broken)."""
    found = jsonscan.members(data, start, end)
    if found is None or "metadata" not in found:
        return None
    out: dict[str, Any] = {}
    for key in ("apiVersion", "kind"):
        if key in found:
            try:
                out[key] = orjson.loads(data[slice(*found[key])])
            except ValueError:
                return None
    # Member by member: managedFields mirror the fields set (fieldsV1), so they nest as deep as the spec does.
    meta_spans = jsonscan.members(data, *found["metadata"])
    if meta_spans is None:
        return None
    try:
        out["metadata"] = {k: orjson.loads(data[slice(*span)]) for k, span in meta_spans.items() if k in _META_FIELDS}
    except (ValueError, RecursionError):
        return None
    if "status" in found:  # a status the operator wrote before decodes (it holds no schema): kept, to write less
        try:
            out["status"] = orjson.loads(data[slice(*found["status"])])
        except (ValueError, RecursionError):
            pass
    if any(not isinstance(out.get(k, ""), str) for k in ("apiVersion", "kind")):
        return None
    out[REFUSED] = reason[:300]
    return out


def loads_object(data: bytes, status_only: bool = False) -> Any:
    """One object (an apiserver's answer to a write) without managedFields (and without the spec when `status_only`:
    a kind whose spec the operator never reads, kube/kinds.py STATUS_ONLY); a stand-in (`refused`) for one nested
    too deep to decode. Raises ValueError (or RecursionError) where
    `data` is not a JSON object."""
    try:
        try:
            return _to_builtins(_OBJECT[status_only].decode(data))
        except msgspec.ValidationError:  # JSON, but not shaped like an object: as a generic decode sees it
            return orjson.loads(data)
    except (ValueError, RecursionError) as exc:
        stand_in = refused(data, _reason(exc))
        if stand_in is None:
            raise
        return stand_in


def _reason(exc: BaseException) -> str:
    return f"it cannot be decoded ({str(exc)[:120] or type(exc).__name__})"


def loads_list(data: bytes | bytearray) -> Any:
    """A list answer: decoded whole when it decodes (orjson, the common case: no cost added), else its metadata and
    each item apart, an item that does not decode as a stand-in (`refused`); an item with no usable metadata leaves
    the list undecodable (ValueError). Raises ValueError where `data` is not a JSON object.
    Why only then, and not one item at a time always: the scanner steps through every token in Python, about twenty
    times the cost of orjson's decode of the whole page (measured: a page of 500 DecisionModels, 0.9 MB, with one item
    nested 3,000 levels, 1.5 s against 0.07 s); a page that decodes pays nothing more than before."""
    try:
        return orjson.loads(data)
    except (ValueError, RecursionError) as exc:
        found = jsonscan.members(data)
        if found is None or "items" not in found:
            raise ValueError(f"not a list ({exc})") from None
        page = {k: orjson.loads(data[slice(*span)]) for k, span in found.items() if k != "items"}
        spans = jsonscan.elements(data, *found["items"])
        if spans is None:
            raise ValueError("the list's items are not an array") from None
        page["items"] = [_item(data, span) for span in spans]
        return page


def _item(data: bytes | bytearray, span: tuple[int, int]) -> Any:
    piece = bytes(data[span[0]:span[1]])
    try:
        return orjson.loads(piece)
    except (ValueError, RecursionError) as exc:
        stand_in = refused(piece, _reason(exc))
        if stand_in is None:
            raise ValueError("a list item has no metadata to name it by") from None
        return stand_in


def loads_event(line: bytes, status_only: bool = False) -> tuple[Any, Any] | None:
    """(type, object) of one watch line, the object slimmed as `loads_object` does, a stand-in (`refused`) for one
    nested too deep to decode; None where the line is not a JSON object. An ERROR event's object (a Status) comes
    whole."""
    try:
        return _loads_event(line, status_only)
    except (ValueError, RecursionError) as exc:
        return _refused_event(line, _reason(exc))


def _refused_event(line: bytes, reason: str) -> tuple[Any, Any] | None:
    found = jsonscan.members(line)
    if found is None or "type" not in found or "object" not in found:
        return None
    try:
        type_ = orjson.loads(line[slice(*found["type"])])
    except ValueError:
        return None
    obj = refused(line, reason, *found["object"])
    return (type_, obj) if isinstance(type_, str) and type_ != "ERROR" and obj is not None else None


def _loads_event(line: bytes, status_only: bool) -> tuple[Any, Any] | None:
    try:
        event = _EVENT[status_only].decode(line)
        if event.type != "ERROR":
            obj = event.object
            return event.type, None if obj is UNSET else _to_builtins(obj)
        doc = orjson.loads(line)
    except msgspec.ValidationError:  # JSON, but not shaped like an event: as a generic decode sees it
        doc = orjson.loads(line)
    # ValueError, RecursionError (not JSON, not UTF-8, nested deeper than the parser goes) go to the caller
    return (doc.get("type"), doc.get("object")) if isinstance(doc, dict) else None
