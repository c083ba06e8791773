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
import time
from typing import Any, Callable

from kubernetes import client as k8s, watch

from .api.backoff import WATCH_RESTART_BACKOFF

log = logging.getLogger("arbiter.nswatch")

Enqueue = Callable[[tuple[str, str]], None]


class NamespaceWatch:
    def __init__(self, api: k8s.ApiClient, enqueue: Enqueue, loop: asyncio.AbstractEventLoop,
                 cache: Any = None) -> None:
        self.api = api
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

    def _hold(self, namespace: str, obj: Any) -> None:
        if self.cache is None:
            return
        if obj is None:
            self.cache.discard("v1", "Namespace", None, namespace)
            return
        self.cache.put({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": namespace, "labels": dict(obj.metadata.labels or {}),
                                     "resourceVersion": obj.metadata.resource_version}})

    def _run(self, namespace: str) -> None:
        core = k8s.CoreV1Api(self.api)
        labels: dict[str, str] | None = None  # as last seen; None until the first answer
        failures = 0
        while self._wanted(namespace):
            try:
                listed = core.list_namespace(field_selector=f"metadata.name={namespace}")
                meta = listed.items[0].metadata if listed.items else None
                now = (meta.labels if meta is not None else None) or {}
                self._hold(namespace, listed.items[0] if listed.items else None)
                if labels is not None and now != labels:
                    self._changed(namespace)
                labels = now
                w = watch.Watch()
                for ev in w.stream(core.list_namespace, field_selector=f"metadata.name={namespace}",
                                   resource_version=listed.metadata.resource_version if listed.metadata else None,
                                   timeout_seconds=300):
                    if not self._wanted(namespace):
                        w.stop()
                        break
                    obj: Any = ev["object"]
                    now = (obj.metadata.labels or {}) if ev["type"] != "DELETED" else {}
                    self._hold(namespace, obj if ev["type"] != "DELETED" else None)
                    if now != labels:
                        labels = now
                        self._changed(namespace)
                failures = 0
            except Exception as exc:  # an expired resourceVersion, a dropped connection, a missing grant: retry
                delay = WATCH_RESTART_BACKOFF.delay(failures)
                failures += 1
                log.warning("watch on namespace %s failed (%s); retrying in %.0fs", namespace,
                            getattr(exc, "reason", None) or type(exc).__name__, delay)
                time.sleep(delay)
