"""What the operator's watch tests against the hostile apiserver (support/hostile_apiserver.py) share: the kinds the
peer serves, named from the operator's own kinds table (kube/kinds.py), and the Triggers the watches feed (the watch
cache, the work queue and the namespace label watch on the same peer)."""

from __future__ import annotations

from arbiter_operator.api.backoff import DoublingBackoff
from arbiter_operator.kube import kinds
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.namespaces import NamespaceLabels
from arbiter_operator.kube.watch import WatchOptions
from arbiter_operator.kube.workqueue import PriorityWorkQueue
from arbiter_operator.triggers import Triggers

from support.hostile_apiserver import HostileApiserver

# Short-lived, as a hostile example lasts seconds: an honest watch ends after a second, silence past 1.3 s is a fault.
FAST_BACKOFF = DoublingBackoff(0.05, 0.2)
# The namespace watch that DecisionModel events start, on the same peer, as short-lived as the child watches.
NAMESPACE_OPTIONS = WatchOptions(timeout_seconds=1, connect_timeout=1.0, read_timeout=1.3, list_timeout=2.0,
                                 healthy_after=0.3, relist_after=1)


def served(*plurals: str) -> dict[str, tuple[str, str]]:
    """The peer's `kinds` (plural -> (apiVersion, kind)) for these watched kinds of the operator's table."""
    by_plural = {k.plural: (k.api_version, k.kind) for k in kinds.WATCHED}
    return {plural: by_plural[plural] for plural in plurals}


def new_triggers(peer: HostileApiserver) -> Triggers:
    """What the watch events go into: the cache, the work queue and (DecisionModel events note their namespace) the
    namespace watch, on the same peer. Stop it with `stop_triggers`."""
    cache = WatchCache(kinds.CACHED)
    queue = PriorityWorkQueue()
    namespaces = NamespaceLabels(peer.configuration(), queue.add, cache=cache, options=NAMESPACE_OPTIONS).start()
    return Triggers(queue, cache, namespaces)


async def stop_triggers(triggers: Triggers) -> None:
    """Stop what `new_triggers` started."""
    await triggers.stop()
    assert isinstance(triggers.namespaces, NamespaceLabels)
    await triggers.namespaces.stop()
