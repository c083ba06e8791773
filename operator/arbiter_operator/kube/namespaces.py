"""Namespaces whose labels change the rendering: a mesh label (`istio-injection`, `istio.io/rev`) added or removed
after a DecisionModel is Ready must reach its InferenceServices without waiting for a resync.

One watch per namespace that holds DecisionModels, on that Namespace alone (`fieldSelector=metadata.name=<ns>`): a
per-namespace Role install can grant it with `resourceNames`, and no request ever lists every namespace. The watches
are kube/watch.py's (one task each on the operator's event loop, with its bounds on a hostile peer); a namespace's
watch starts with its first DecisionModel and stops when it holds none. When the namespace's labels change, every
DecisionModel seen there is queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..api.names import CORE_API
from .watch import Resource, Watches, WatchOptions, namespaces

log = logging.getLogger("arbiter.namespaces")

Enqueue = Callable[[tuple[str, str]], None]

# Listing one Namespace costs the apiserver next to nothing: after any failure, list again (never resume from a
# resourceVersion a misbehaving peer handed out).
OPTIONS = WatchOptions(relist_after=1)


def namespace_resource(namespace: str) -> Resource:
    return namespaces(field_selector=f"metadata.name={namespace}")


class NamespaceLabels:
    """The label watches of the namespaces holding DecisionModels (start it on the running loop)."""

    def __init__(self, config: Any, enqueue: Enqueue, cache: Any = None, options: WatchOptions | None = None) -> None:
        self.cache = cache  # the watch cache (cache.WatchCache): the labels seen are what the reconcile reads
        self.enqueue = enqueue
        self.models: dict[str, set[str]] = {}
        self._labels: dict[str, dict[str, str]] = {}  # as last seen; absent until the first answer
        self._watches = Watches(config, [], [], self._event, self._listed, options or OPTIONS)

    def start(self) -> NamespaceLabels:
        self._watches.start()
        return self

    @property
    def watched(self) -> set[str]:
        return {r.field_selector.partition("=")[2] for r in self._watches.resources if r.field_selector}

    def running(self, namespace: str) -> bool:
        return self._watches.running and namespace in self.watched

    def note(self, namespace: str, name: str) -> None:
        self.models.setdefault(namespace, set()).add(name)
        self._watches.add(namespace_resource(namespace))

    def forget(self, namespace: str, name: str) -> None:
        names = self.models.get(namespace, set())
        names.discard(name)
        if not names:
            self.models.pop(namespace, None)
            self._labels.pop(namespace, None)
            self._watches.remove(namespace_resource(namespace))

    async def stop(self) -> None:
        await self._watches.stop()

    def _seen(self, namespace: str, obj: dict[str, Any] | None) -> None:
        if namespace not in self.models:
            return  # an answer of a watch just stopped
        self._hold(namespace, obj)
        current = dict((obj or {}).get("metadata", {}).get("labels") or {})
        before = self._labels.get(namespace)
        self._labels[namespace] = current
        if before is not None and current != before:
            names = sorted(self.models.get(namespace, ()))
            log.info("labels of namespace %s changed: reconciling %s", namespace, ", ".join(names))
            for name in names:
                self.enqueue((namespace, name))

    def _hold(self, namespace: str, obj: dict[str, Any] | None) -> None:
        if self.cache is None:
            return
        if obj is None:
            self.cache.discard(CORE_API, "Namespace", None, namespace)
            return
        # Held without a resourceVersion, so the cache replaces rather than compares: this watch is its only source
        # of Namespaces and the order of its answers is the apiserver's. Compared, an event that claimed a
        # resourceVersion the apiserver never reached (a peer misbehaving, a proxy replaying) would pin stale labels
        # for good. The reconcile reads only the labels.
        self.cache.put({"apiVersion": CORE_API, "kind": "Namespace",
                        "metadata": {"name": namespace, "labels": dict(obj["metadata"].get("labels") or {})}})

    @staticmethod
    def _asked(resource: Resource) -> str:
        return (resource.field_selector or "").partition("=")[2]

    def _listed(self, resource: Resource, _scope: str | None, objs: list[dict[str, Any]], _rv: str) -> None:
        # Only the namespace asked for: an answer about another one (a peer that ignores the field selector) says
        # nothing about this one's labels.
        namespace = self._asked(resource)
        found = [o for o in objs if o["metadata"]["name"] == namespace]
        self._seen(namespace, found[0] if found else None)

    def _event(self, resource: Resource, type_: str, obj: dict[str, Any]) -> None:
        namespace = self._asked(resource)
        if obj["metadata"]["name"] == namespace:
            self._seen(namespace, None if type_ == "DELETED" else obj)
