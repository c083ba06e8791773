"""Sharding by namespace label: `--namespace-selector team=risk` makes this operator own exactly the namespaces whose
labels match, for fleets too large for one process (docs/operations.md, "Sharding").

The operator watches a fixed list of namespaces (cluster-wide scanning is off: docs/security.md), so the selector is
resolved to a list when the operator starts, and a watch on Namespaces with the same selector tells when the list
changed (a namespace labelled into or out of the shard, created or deleted). The operator then stops its kopf run
cleanly (the leader Lease is handed back) and starts again on the new list in the same process: no container
restart, and the new namespace's DecisionModels are reconciled within seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client as k8s

from .namespaces import Event, Namespace, WatchOptions, follow, list_namespaces

log = logging.getLogger("arbiter.shard")


def matching_namespaces(api: k8s.ApiClient, selector: str,
                        options: WatchOptions | None = None) -> tuple[set[str], str]:
    """The names of the namespaces the selector matches now, and the list's resourceVersion (to watch from)."""
    found, resource_version = list_namespaces(api, [("labelSelector", selector)], options or WatchOptions())
    return set(found), resource_version


def membership_change(owned: set[str], event_type: str, name: str) -> bool:
    """Whether one watch event (on the selector's watch) changes the set of namespaces this shard owns (pure).

    A namespace leaving the selector arrives as DELETED on a label-selected watch, like a deletion. A terminating
    namespace stays owned until it is gone: its DecisionModels' finalizers still need this operator."""
    if event_type in ("ADDED", "MODIFIED"):
        return name not in owned
    if event_type == "DELETED":
        return name in owned
    return False


class NamespaceSetWatch:
    """Calls `on_change` once when the namespaces matching `selector` are no longer `owned` (daemon thread)."""

    def __init__(self, api: k8s.ApiClient, selector: str, owned: set[str], resource_version: str,
                 on_change: Callable[[], None], options: WatchOptions | None = None) -> None:
        self.api, self.selector, self.owned = api, selector, set(owned)
        self.resource_version = resource_version
        self.on_change = on_change
        self.options = options or WatchOptions()
        self.changed = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-namespaces", daemon=True)

    def start(self) -> NamespaceSetWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _changed(self, why: str) -> None:
        if not self.changed.is_set():
            log.info("namespaces matching %r changed (%s): restarting the watches", self.selector, why)
            self.changed.set()
            self.on_change()

    def _listed(self, found: dict[str, Namespace]) -> bool:
        # A fresh list (after an expired resourceVersion or a failure): compare it with what is owned.
        if set(found) != self.owned:
            self._changed(f"now {sorted(found)}")
            return False
        return True

    def _event(self, event: Event) -> bool:
        assert event.namespace is not None
        if membership_change(self.owned, event.type, event.namespace.name):
            self._changed(f"{event.type.lower()} {event.namespace.name}")
            return False
        return True

    def _run(self) -> None:
        follow(self.api, [("labelSelector", self.selector)], what=f"namespaces matching {self.selector!r}",
               on_list=self._listed, on_event=self._event, stop=self._stopped,
               resource_version=self.resource_version, options=self.options)


def serve_liveness_until(endpoint: str | None, stop: threading.Event) -> None:
    """While the shard owns no namespace there is no kopf run to answer the liveness probe: answer it here."""
    if not endpoint:
        stop.wait()
        return
    url = urlsplit(endpoint)
    path = url.path or "/"

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path.split("?")[0] == path else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Probe)
    threading.Thread(target=server.serve_forever, name="shard-liveness", daemon=True).start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()


def run_shard(api: k8s.ApiClient, selector: str, run: Callable[[list[str], threading.Event], None],
              liveness: str | None, options: WatchOptions | None = None) -> None:
    """Run the operator on the namespaces matching `selector`, again each time that set changes; return when a run
    ends for any other reason (SIGTERM)."""
    options = options or WatchOptions()
    failures = 0  # lists that failed, and runs that ended early, in a row
    while True:
        if failures:
            # A list that failed (the apiserver restarting, an error status, an answer that is not a NamespaceList)
            # is asked again after a back-off rather than ending the process; and a set that keeps changing (or a
            # peer that keeps saying so) restarts the watches at a bounded rate, not in a tight loop.
            time.sleep(options.backoff.delay(failures - 1))
        started = time.monotonic()
        try:
            owned, resource_version = matching_namespaces(api, selector, options)
        except Exception as exc:
            failures += 1
            log.warning("cannot list the namespaces matching %r (%s); retrying", selector, str(exc)[:300])
            continue
        stop = threading.Event()
        watcher = NamespaceSetWatch(api, selector, owned, resource_version, on_change=stop.set,
                                    options=options).start()
        try:
            if owned:
                log.info("shard %r owns namespaces %s", selector, ", ".join(sorted(owned)))
                run(sorted(owned), stop)
            else:
                log.warning("no namespace matches %r: waiting for one to be labelled", selector)
                serve_liveness_until(liveness, stop)
        finally:
            watcher.stop()
        if not watcher.changed.is_set():
            return
        failures = 0 if time.monotonic() - started >= options.healthy_after else failures + 1
