"""What the watches watch and what they accept: a watched kind (`Resource`), how the watches talk to the apiserver
(`WatchOptions`), the ways a list or watch ends (`Gone`, `NotServed`, `Failed`), and what a well-formed answer is
(`object_of` for one object, `list_page` for one page of a list). Pure but for the log line and the metric of a
stand-in (an object the decoders could not build, `api.kubejson.refused`); kube/watch.py runs the streams."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api.backoff import WATCH_RESTART_BACKOFF, DoublingBackoff
from ..api.kubejson import REFUSED, loads_list
from ..api.names import CORE_API
from ..api.wire import resource_version
from ..metrics import OBJECTS_REFUSED
from .kinds import KINDS, kind_of

log = logging.getLogger("arbiter.watches")



# A namespace name is a DNS-1123 label (the apiserver validates it); anything else in an answer is not a namespace.
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    label: str | None  # the label every object of the watch carries (a server-side `labelSelector=<label>`)
    namespaced: bool = True  # False: a cluster-scoped kind (Namespaces), whose objects have no namespace
    selector: str | None = None  # a further label selector, left to the server (a shard's `team=risk`)
    field_selector: str | None = None  # e.g. `metadata.name=NS`: one object, which a Role grants by resourceNames
    names: re.Pattern[str] | None = None  # what a well-formed object's name matches, beyond its length
    # Served on every apiserver (a built-in kind): a 404 on the first list is a fault, retried, not "not installed".
    always_served: bool = False

    def path(self, namespace: str | None) -> str:
        return kind_of(self.api_version, self.kind).path(namespace)


@dataclass(frozen=True)
class WatchOptions:
    """How the watches talk to the apiserver; the defaults are the product's, tests shorten them."""

    timeout_seconds: int = 300  # asked of the apiserver for each watch
    connect_timeout: float = 30.0
    read_timeout: float = 330.0  # silence on a connection (a watch's longest gap is the apiserver's timeout)
    list_timeout: float = 120.0  # one list page
    page_size: int = 500
    max_page_bytes: int = 256 * 1024 * 1024
    max_event_bytes: int = 8 * 1024 * 1024  # one watch line; etcd stores objects of at most 1.5 MiB by default
    # A watch that ended (or failed) sooner than this after it began counts as a failure: the next attempt waits.
    healthy_after: float = 10.0
    relist_after: int = 3  # failures in a row after which the next attempt lists again
    backoff: DoublingBackoff = field(default=WATCH_RESTART_BACKOFF)


class Gone(Exception):
    """The resourceVersion is too old, or the watch ended in an ERROR event: list again."""


class NotServed(Exception):
    """404 on a list: the apiserver does not serve the kind."""


class Failed(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


# on_event(resource, type, object): ADDED / MODIFIED / DELETED of a well-formed object.
OnEvent = Callable[[Resource, str, dict[str, Any]], None]
# on_list(resource, namespace or None, objects, resourceVersion): the whole content of one scope, after every list.
OnList = Callable[[Resource, "str | None", list[dict[str, Any]], str], None]
# known(resource, namespace, name, resourceVersion): whether the caller already holds that very object (an ADDED or
# MODIFIED of it then carries nothing new, and is not decoded whole nor handed to on_event).
Known = Callable[[Resource, str, str, str], bool]


def short(value: Any, limit: int = 200) -> str:
    return str(value)[:limit]


def namespaces(field_selector: str | None = None, selector: str | None = None) -> Resource:
    """Namespaces, as a cluster-scoped kind, one (`metadata.name=NS`) or those a label selector matches."""
    k = KINDS[(CORE_API, "Namespace")]
    return Resource(k.api_version, k.kind, k.plural, None, namespaced=k.namespaced, selector=selector,
                    field_selector=field_selector, names=NAMESPACE_NAME, always_served=True)


def object_of(resource: Resource, namespace: str | None, obj: Any, deleted: bool = False) -> dict[str, Any] | None:
    """`obj` as a well-formed object of `resource` in the watch's scope, apiVersion and kind filled in (list items of
    built-in kinds have neither); None where it is not one (pure but for filling in those two fields). A deletion
    need not bear the label: an object whose label was removed leaves the selection as DELETED."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not 0 < len(name) <= 253:
        return None
    if resource.names is not None and not resource.names.fullmatch(name):
        return None
    if not resource.namespaced:
        if ns is not None:
            return None
    elif not isinstance(ns, str) or not 0 < len(ns) <= 63 or (namespace is not None and ns != namespace):
        return None
    labels = meta.get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return None
    if resource.label and resource.label not in labels and not deleted:
        return None
    for key in ("resourceVersion", "uid"):
        if meta.get(key) is not None and not isinstance(meta.get(key), str):
            return None
    if obj.get("kind", resource.kind) != resource.kind or obj.get("apiVersion", resource.api_version) != \
            resource.api_version:
        return None
    obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
    return obj


def list_page(resource: Resource, namespace: str | None, body: bytes) -> tuple[list[dict[str, Any]], str, str]:
    """One page of a list answer: its objects, resourceVersion and continue token; Failed unless every part is
    well-formed (pure: nothing is acted on half of an answer)."""
    try:
        doc = loads_list(body)  # an item that does not decode comes as a stand-in (api/kubejson.py `refused`)
    except (ValueError, RecursionError):
        raise Failed("the list is not JSON") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or not isinstance(items, list):
        raise Failed(f"the answer is not a {resource.kind}List")
    rv = resource_version(meta.get("resourceVersion"))
    if not rv:
        raise Failed("the list has no resourceVersion")
    objs = []
    for item in items:
        obj = object_of(resource, namespace, item)
        if obj is None:
            raise Failed(f"the list holds an item that is not a {resource.kind}")
        note_refused(obj)
        objs.append(obj)
    token = meta.get("continue") or ""
    if not isinstance(token, str) or len(token) > 4096:
        raise Failed("the list's continue token is not a string")
    return objs, rv, token


def note_refused(obj: dict[str, Any]) -> None:
    """Count and log a stand-in for an object that could not be decoded (the reconcile reports it on its status)."""
    if REFUSED in obj:
        meta = obj["metadata"]
        OBJECTS_REFUSED.labels(obj["kind"], "Undecodable").inc()
        log.warning("%s %s/%s: %s; held as a stand-in (its metadata only)", obj["kind"], meta["namespace"],
                    meta["name"], obj[REFUSED])

