"""Sharding by namespace label: `--namespace-selector team=risk` makes this operator own exactly the namespaces whose
labels match, for fleets too large for one process (docs/operations.md, "Sharding").

The operator watches a fixed list of namespaces (cluster-wide scanning is off: docs/security.md), so the selector is
resolved to a list by a fresh list of the matching Namespaces, and a watch on Namespaces with the same selector
(kube/watch.py, on the event loop) tells when the list changed (a namespace labelled into or out of the shard,
created or deleted). The operator then stops its kopf run cleanly (the leader Lease is handed back) and starts again
on the new list in the same process and on the same event loop: no container restart, and the new namespace's
DecisionModels are reconciled within seconds.

While no namespace matches, the kopf run goes on with nothing to watch (`run([], stop)`): kopf's own probe server
answers the liveness probe, as in every other state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .watch import Resource, Watches, WatchOptions, namespaces

log = logging.getLogger("arbiter.shard")

# A run of the operator on `namespaces` until `stop` is set (or the process is told to stop).
Run = Callable[[list[str], asyncio.Event], Awaitable[None]]

# A namespace list is small: after any failure, list again (never resume from a resourceVersion a misbehaving peer
# handed out).
OPTIONS = WatchOptions(relist_after=1)


def membership_change(owned: set[str], event_type: str, name: str) -> bool:
    """Whether one watch event (on the selector's watch) changes the set of namespaces this shard owns (pure).

    A namespace leaving the selector arrives as DELETED on a label-selected watch, like a deletion. A terminating
    namespace stays owned until it is gone: its DecisionModels' finalizers still need this operator."""
    if event_type in ("ADDED", "MODIFIED"):
        return name not in owned
    if event_type == "DELETED":
        return name in owned
    return False


class NamespaceSet:
    """The namespaces matching `selector`: `owned` is the first list's answer (`listed` is set then), `changed` is set
    once a later list or an event says the matching set is not `owned` any more."""

    def __init__(self, config: Any, selector: str, options: WatchOptions) -> None:
        self.selector = selector
        self.owned: set[str] | None = None
        self.listed, self.changed = asyncio.Event(), asyncio.Event()
        self._watches = Watches(config, [namespaces(selector=selector)], [], self._event, self._list, options)

    def start(self) -> NamespaceSet:
        self._watches.start()
        return self

    async def stop(self) -> None:
        await self._watches.stop()

    def _change(self, why: str) -> None:
        if not self.changed.is_set():
            log.info("namespaces matching %r changed (%s): restarting the watches", self.selector, why)
            self.changed.set()

    def _list(self, _resource: Resource, _scope: str | None, objs: list[dict[str, Any]], _rv: str) -> None:
        found = {o["metadata"]["name"] for o in objs}
        if self.owned is None:
            self.owned = found
            self.listed.set()
        elif found != self.owned:  # a fresh list (after an expired resourceVersion or a failure)
            self._change(f"now {sorted(found)}")

    def _event(self, _resource: Resource, type_: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if self.owned is not None and membership_change(self.owned, type_, name):
            self._change(f"{type_.lower()} {name}")


async def run_shard(config: Any, selector: str, run: Run, options: WatchOptions | None = None) -> None:
    """Run the operator on the namespaces matching `selector`, again each time that set changes; return when a run
    ends for any other reason (SIGTERM)."""
    options = options or OPTIONS
    failures = 0  # runs that ended early, in a row
    while True:
        if failures:
            # A set that keeps changing (or a peer that keeps saying so) restarts the operator at a bounded rate,
            # not in a tight loop. (A list that fails is retried by the watch itself, after its back-off.)
            await asyncio.sleep(options.backoff.delay(failures - 1))
        started = time.monotonic()
        members = NamespaceSet(config, selector, options).start()
        try:
            await members.listed.wait()
            owned = sorted(members.owned or ())
            if owned:
                log.info("shard %r owns namespaces %s", selector, ", ".join(owned))
            else:
                log.warning("no namespace matches %r: waiting for one to be labelled", selector)
            await run(owned, members.changed)
        finally:
            await members.stop()
        if not members.changed.is_set():
            return
        failures = 0 if time.monotonic() - started >= options.healthy_after else failures + 1
