"""The composition root: what the operator is built from, in one place. One `Operator` per kopf run (a shard that
restarts on a new namespace list builds a new one, so nothing of the old run's memory survives it):

  watch cache  <- the watches of every watched kind (kube/kinds.py), fed through `Triggers` (triggers.py)
  work queue   <- Triggers (watch events), the workers' requeues and back-offs
  workers      -> Reconciler (reconcile.py) over a CachedKubeClient (reads from the cache, writes through it)

Nothing here decides anything about a DecisionModel; handlers.py only hands kopf's start-up and clean-up to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from . import metrics
from .api.backoff import RECONCILE_ERROR_BACKOFF
from .clients.prometheus import PrometheusClient, PrometheusConfig
from .clients.s3_identity import OwnCredentials
from .kube import kinds
from .kube.cache import CachedKubeClient, WatchCache
from .kube.client import KubeError, RestKubeClient, new_api_client
from .kube.leader import LeaderElector
from .kube.namespaces import NamespaceLabels
from .kube.transport import LoopTransport
from .kube.watch import Resource, Watches, WatchOptions
from .kube.workqueue import Key, PriorityWorkQueue
from .observe.storage import VerdictCache
from .reconcile import Reconciler
from .settings import argocd_namespace, metrics_reader_secret, runtime_image, s3_own_credentials
from .state_metrics import DecisionModelStateCollector, cache_lister
from .triggers import Triggers

log = logging.getLogger("arbiter.app")

# A periodic resync of converged DecisionModels is off by default: every trigger that matters arrives as a watch event
# or as the plan's own requeue (promotion holds, rechecks while a condition is Unknown), and an idle operator should
# make no API or S3 requests (docs/benchmarks.md, idle cost). Namespace labels are watched; set it (seconds) only to
# catch what no watch reports.
RESYNC_ENV = "ARBITER_RESYNC_SECONDS"
WORKERS_ENV = "ARBITER_WORKERS"
# Passes in parallel. A pass is mostly waiting for the apiserver, so more workers than CPUs is what keeps a burst
# short (200 new DecisionModels on 2 cores: every InferenceService made in 10.8 s with 16, 20.2 s with 4; a version
# Ready 0.06 s after KServe's Ready at p95 with 16, 3.0 s with 4: benchmarks/HISTORY.md, "16 workers").
DEFAULT_WORKERS = 16

# The operator's watches (kube/watch.py): every watched kind of kube/kinds.py, with its label selector.
WATCHED = tuple(Resource(k.api_version, k.kind, k.plural, k.label) for k in kinds.WATCHED)


@dataclass(frozen=True)
class LeaderConfig:
    """--leader-elect: the Lease and this replica's identity."""

    namespace: str
    name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None = None  # the --kubeconfig path, or None (in-cluster, then $KUBECONFIG)
    namespaces: list[str] = field(default_factory=list)  # the namespaces watched ([]: cluster-wide)
    leader: LeaderConfig | None = None
    # A shard that owns no namespace: kopf runs for its probe only; nothing to watch or reconcile, no Lease.
    idle: bool = False


async def worker(queue: PriorityWorkQueue, reconciler: Reconciler, failures: dict[Key, int], leading: asyncio.Event,
                 resync_seconds: float, primed: asyncio.Event) -> None:
    while True:
        await leading.wait()  # a standby's queue fills from the watches; it is worked off once this replica leads
        # Not before every child kind's first list is in the cache: a half-filled cache would look like missing
        # children, which a pass would create again (and a Ready model would flip to not Ready).
        await primed.wait()
        key = await queue.get()
        started = time.monotonic()
        try:
            requeue = await reconciler.reconcile(*key)
            result = metrics.CONVERGED if requeue is None else metrics.REQUEUED
            metrics.RECONCILES.labels(result).inc()
            metrics.RECONCILE_SECONDS.labels(result).observe(time.monotonic() - started)
            failures.pop(key, None)
            delays = [d for d in (requeue, resync_seconds or None) if d is not None]
            queue.reschedule(key, min(delays) if delays else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            metrics.RECONCILES.labels(metrics.ERROR).inc()
            metrics.RECONCILE_SECONDS.labels(metrics.ERROR).observe(time.monotonic() - started)
            metrics.RECONCILE_ERRORS.labels("kube" if isinstance(exc, KubeError) else "other").inc()
            n = failures.get(key, 0)
            failures[key] = n + 1
            delay = RECONCILE_ERROR_BACKOFF.delay(n)
            log.error("reconcile of %s/%s failed (%s); retrying in %.0fs", key[0], key[1], exc, delay)
            queue.add_after(key, delay)
        finally:
            queue.done(key)


def watches_for(triggers: Triggers, config: Any, resources: list[Resource], namespaces: list[str],
                options: WatchOptions | None = None) -> Watches:
    """The watches of `resources` feeding `triggers` (not started)."""
    return Watches(config, resources, namespaces, triggers.event, triggers.listed, options, known=triggers.known,
                   skim=kinds.ECHOING)


class OperatorWatches:
    """The operator's watches and their triggers, started and stopped together."""

    def __init__(self, triggers: Triggers, watches: Watches) -> None:
        self.triggers, self.watches = triggers, watches
        self.primed = watches.primed

    async def stop(self) -> None:
        await self.watches.stop()
        await self.triggers.stop()


class Operator:
    """Everything one kopf run starts (`start`, from kopf's start-up) and stops (`stop`, from its clean-up)."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.leading = asyncio.Event()
        self._elector: LeaderElector | None = None
        self._namespace_labels: NamespaceLabels | None = None
        self._watches: OperatorWatches | None = None
        self._transport: LoopTransport | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._state_metrics: DecisionModelStateCollector | None = None

    async def start(self) -> None:
        if self.config.idle:
            return
        # Settings first: a bad one fails the start-up before anything is started.
        resync = float(os.environ.get(RESYNC_ENV, "0"))
        workers = max(1, int(os.environ.get(WORKERS_ENV, str(DEFAULT_WORKERS))))
        api = new_api_client(self.config.kubeconfig)
        # Every request to the apiserver is made on this event loop (aiohttp): the reconcile's, the Lease's, the
        # watches'.
        self._transport = LoopTransport(api.configuration, asyncio.get_running_loop(), user_agent=api.user_agent)
        fence = self._elect(self._transport)
        queue = PriorityWorkQueue()
        # Reads of DecisionModels, children, predictor Deployments and namespace labels come from the watch cache.
        cache = WatchCache(kinds.CACHED)
        # Per-DecisionModel state series, read from the cache at each scrape (state_metrics.py).
        self._state_metrics = DecisionModelStateCollector(cache_lister(cache), self.leading.is_set)
        REGISTRY.register(self._state_metrics)
        kube = CachedKubeClient(RestKubeClient(api, fence=fence, transport=self._transport), cache)
        reconciler = Reconciler(kube, prometheus=_prometheus(), runtime_image=runtime_image(),
                                metrics_reader_secret=metrics_reader_secret(), argocd_namespace=argocd_namespace(),
                                verdicts=VerdictCache(own_credentials=OwnCredentials() if s3_own_credentials()
                                                      else None))
        # Namespace labels that change the rendering (mesh) are watched, per namespace holding DecisionModels.
        self._namespace_labels = NamespaceLabels(api.configuration, queue.add, cache=cache).start()
        triggers = Triggers(queue, cache, self._namespace_labels)
        self._watches = start_watches(triggers, api.configuration, self.config.namespaces)
        failures: dict[Key, int] = {}
        self._tasks = [asyncio.create_task(worker(queue, reconciler, failures, self.leading, resync,
                                                  self._watches.primed)) for _ in range(workers)]

    def _elect(self, transport: LoopTransport) -> Any:
        """Start leader election when configured; the fence every write checks (None: the only replica)."""
        election = self.config.leader
        if election is None:
            metrics.LEADER.set(1)  # the only replica
            self.leading.set()
            return None

        def started_leading() -> None:
            metrics.LEADER.set(1)
            self.leading.set()

        def lost() -> None:
            # Like client-go's controllers: exit, and come back (the kubelet restarts the container) as a standby.
            # The fence already refuses every write; nothing in memory needs saving (status is the state).
            metrics.LEADER.set(0)
            logging.shutdown()
            os._exit(1)

        elector = LeaderElector(transport, election.namespace,
                                name=election.name or "arbiter-operator-leader",
                                identity=election.identity, lease_duration=election.lease_duration,
                                renew_deadline=election.renew_deadline, retry_period=election.retry_period,
                                on_started_leading=started_leading, on_lost=lost)
        self._elector = elector
        log.info("leader election on: Lease %s/%s, identity %s", election.namespace, elector.name, elector.identity)
        elector.start()
        return elector.is_leader

    async def stop(self) -> None:
        """In the reverse order of `start`. The workers are gone before the Lease is handed back (no pass of this
        replica writes while the standby's first ones do), and the watches before the namespace watches they feed
        (a DecisionModel event would start a namespace's watch again)."""
        if self._state_metrics is not None:  # a shard's restart registers the next run's
            REGISTRY.unregister(self._state_metrics)
            self._state_metrics = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._elector is not None:  # hand the Lease back: the standby takes over at its next retry
            await self._elector.stop()
        if self._watches is not None:  # a shard's restart starts new ones on the new namespace list
            await self._watches.stop()
        if self._namespace_labels is not None:
            await self._namespace_labels.stop()
        if self._transport is not None:
            await self._transport.close()


def _prometheus() -> PrometheusClient | None:
    """The canary analyses' Prometheus (docs/operations.md, "Promotion metrics")."""
    try:
        return PrometheusClient(PrometheusConfig.from_env(os.environ))
    except Exception as exc:  # e.g. an unreadable CA file: serving goes on, promotion steps wait for an analysis
        log.error("cannot set up the Prometheus client (%s); promotion analyses cannot run", exc)
        return None


def start_watches(triggers: Triggers, config: Any, namespaces: list[str], options: WatchOptions | None = None,
                  resources: tuple[Resource, ...] = WATCHED) -> OperatorWatches:
    """List and watch DecisionModels and every child kind, cluster-wide or in each of `namespaces`."""
    return OperatorWatches(triggers, watches_for(triggers, config, list(resources), namespaces, options).start())
