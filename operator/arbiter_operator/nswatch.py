"""Namespaces whose labels change the rendering: a mesh label (`istio-injection`, `istio.io/rev`) added or removed
after a DecisionModel is Ready must reach its InferenceServices without waiting for a resync.

One watch per namespace that holds DecisionModels, on that Namespace alone (`fieldSelector=metadata.name=<ns>`): a
per-namespace Role install can grant it with `resourceNames`, and no request ever lists every namespace. When the
namespace's labels change, every DecisionModel seen there is queued. Each watch runs in its own daemon thread (the
kubernetes client's watch blocks) and stops when the namespace holds no DecisionModel any more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from .kube.namespaces import Event, Namespace, WatchOptions, follow

log = logging.getLogger("arbiter.nswatch")

Enqueue = Callable[[tuple[str, str]], None]


class NamespaceWatch:
    def __init__(self, api: k8s.ApiClient, enqueue: Enqueue, loop: asyncio.AbstractEventLoop,
                 cache: Any = None, options: WatchOptions | None = None) -> None:
        self.api = api
        self.options = options or WatchOptions()
        self.cache = cache  # the watch cache (cache.WatchCache): the labels seen are what the reconcile reads
        self.enqueue = enqueue
        self.loop = loop
        self.models: dict[str, set[str]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def note(self, namespace: str, name: str) -> None:
        with self._lock:
            self.models.setdefault(namespace, set()).add(name)
            if namespace in self._threads and self._threads[namespace].is_alive():
                return
            t = threading.Thread(target=self._run, args=(namespace,), name=f"nswatch-{namespace}", daemon=True)
            self._threads[namespace] = t
        t.start()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self.models.get(namespace, set()).discard(name)

    def stop(self) -> None:
        self._stopped.set()

    def _wanted(self, namespace: str) -> bool:
        with self._lock:
            return bool(self.models.get(namespace)) and not self._stopped.is_set()

    def _changed(self, namespace: str) -> None:
        with self._lock:
            names = sorted(self.models.get(namespace, ()))
        log.info("labels of namespace %s changed: reconciling %s", namespace, ", ".join(names))
        for name in names:
            self.loop.call_soon_threadsafe(self.enqueue, (namespace, name))

    def _hold(self, namespace: str, seen: Namespace | None) -> None:
        if self.cache is None:
            return
        if seen is None:
            self.cache.discard("v1", "Namespace", None, namespace)
            return
        # Held without a resourceVersion, so the cache replaces rather than compares: this watch is its only source
        # of Namespaces and the order of its answers is the apiserver's. Compared, an event that claimed a
        # resourceVersion the apiserver never reached (a peer misbehaving, a proxy replaying) would pin stale labels
        # for good. The reconcile reads only the labels.
        self.cache.put({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": namespace, "labels": dict(seen.labels)}})

    def _run(self, namespace: str) -> None:
        labels: dict[str, str] | None = None  # as last seen; None until the first answer

        def seen(now: Namespace | None) -> None:
            nonlocal labels
            self._hold(namespace, now)
            current = now.labels if now is not None else {}
            if labels is not None and current != labels:
                self._changed(namespace)
            labels = current

        def on_list(found: dict[str, Namespace]) -> bool:
            # Only the namespace asked for: an answer about another one (a peer that ignores the field selector) says
            # nothing about this one's labels.
            seen(found.get(namespace))
            return True

        def on_event(event: Event) -> bool:
            assert event.namespace is not None
            if event.namespace.name == namespace:
                seen(event.namespace if event.type != "DELETED" else None)
            return True

        follow(self.api, [("fieldSelector", f"metadata.name={namespace}")], what=f"namespace {namespace}",
               on_list=on_list, on_event=on_event, stop=self._stopped, wanted=lambda: self._wanted(namespace),
               options=self.options)
