"""Thin kopf glue: kopf runs the operator's log-in, start-up and clean-up; the operator's own watches (kube/watch.py)
list and watch the DecisionModels and their children, and `WatchEvents` puts each event in the watch cache and, where
a pass must react, the owning DecisionModel in a work queue; workers run the one level-based reconcile
(reconcile.Reconciler) and schedule the requeue the plan asks for.

Why no kopf resource handler: kopf's change handlers store progress and diff-base annotations on the object, its
daemons and timers add a finalizer, i.e. they write to the DecisionModel on their own, and its per-event machinery
(a Body, a logger, an index and handler bookkeeping per event) cost more CPU than what the operator does with an
event. A level-based reconcile needs none of it, and a converged DecisionModel then sees zero writes. The registry's
delete finalizer is part of that reconcile too (registry_handlers.RegistryFinalizer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from typing import Any

import kopf

from . import metrics
from .api import jsonfast
from .api.backoff import RECONCILE_ERROR_BACKOFF
from .api.names import API_VERSION, ISVC_LABEL, KIND, PLURAL
from .clients.prometheus import PrometheusClient, PrometheusConfig
from .kube.cache import CachedKubeClient, WatchCache
from .kube.client import KubeError, RestKubeClient, new_api_client
from .kube.namespaces import NamespaceLabels
from .kube.transport import LoopTransport
from .kube.watch import Resource, Watches, WatchOptions
from .plan.planner import isvc_state
from .plan.predictors import as_map, as_maps, deployment_problem, predictor_problem
from .reconcile import Reconciler
from .render.common import LABEL_DM
from .render.podmonitor import API_VERSION as PODMONITOR_API
from .settings import runtime_image

log = logging.getLogger("arbiter.handlers")

Key = tuple[str, str]


class WorkQueue:
    """Deduplicating queue with delayed adds; one key is never reconciled by two workers at once.

    Two lanes: a wake-up marked `urgent` (KServe's verdict on a version changed: it became ready, failed, or its
    pods got into trouble) is served before the ordinary ones (a DecisionModel created or edited, a child drifted).
    When a fleet is created at once, a thousand first passes queue up in minutes while KServe brings the versions
    up over many; in one line, a version KServe has just made ready would wait behind all of them for the pass that
    routes traffic to it. The urgent lane cannot starve the other: it fills at KServe's pace, a few per second.
    """

    def __init__(self) -> None:
        self._lanes: tuple[deque[Key], deque[Key]] = (deque(), deque())  # (urgent, ordinary)
        # One count per entry in the lanes; an entry whose key was taken by another entry (a key made urgent while
        # it waited in the ordinary lane sits in both) is skipped when it comes up.
        self._entries = asyncio.Semaphore(0)
        self._pending: dict[Key, bool] = {}  # key -> urgent
        self._active: set[Key] = set()
        self._dirty: dict[Key, bool] = {}  # changed while a pass ran: key -> urgent
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._since: dict[Key, float] = {}  # when each pending key became due (queue wait metric)

    def add(self, key: Key, urgent: bool = False) -> None:
        if key in self._active:
            self._dirty[key] = self._dirty.get(key, False) or urgent  # reconcile again right after the running one
            return
        waiting = self._pending.get(key)
        if waiting is None:
            self._since[key] = time.monotonic()
        elif waiting or not urgent:
            return  # already waiting in a lane at least as fast
        self._pending[key] = urgent
        self._lanes[0 if urgent else 1].append(key)
        self._entries.release()
        metrics.QUEUE_DEPTH.set(len(self._pending))

    def add_after(self, key: Key, delay: float) -> None:
        old = self._timers.get(key)
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if old is not None:
            if old.when() <= when:
                return  # an earlier wake-up is already scheduled
            old.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def reschedule(self, key: Key, delay: float | None) -> None:
        """The next wake-up a finished pass asked for, replacing any earlier one: a pass plans from everything it
        observed, so a timer an older pass set (a loading poll, a recheck) is stale once this one converged; left
        in place it would wake a converged DecisionModel for nothing."""
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        if delay is not None:
            self.add_after(key, delay)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        while True:
            await self._entries.acquire()
            lane = self._lanes[0] if self._lanes[0] else self._lanes[1]
            key = lane.popleft()
            if self._pending.pop(key, None) is not None:
                break
        self._active.add(key)
        metrics.QUEUE_DEPTH.set(len(self._pending))
        since = self._since.pop(key, None)
        if since is not None:
            metrics.QUEUE_WAIT_SECONDS.observe(time.monotonic() - since)
        return key

    def done(self, key: Key) -> None:
        self._active.discard(key)
        urgent = self._dirty.pop(key, None)
        if urgent is not None:
            self.add(key, urgent)


QUEUE_KEY = "arbiter_queue"
CACHE_KEY = "arbiter_cache"
NSWATCH_KEY = "arbiter_nswatch"
IDLE_KEY = "arbiter_idle"  # set by __main__ for a shard that owns no namespace: kopf runs for its probe only
LEADER_KEY = "arbiter_leader"  # set by __main__ with --leader-elect: the Lease settings and this replica's identity
KUBECONFIG_KEY = "arbiter_kubeconfig"  # set by __main__: the --kubeconfig path, or None (in-cluster, then $KUBECONFIG)
NAMESPACES_KEY = "arbiter_namespaces"  # set by __main__: the namespaces the operator watches ([]: cluster-wide)
WATCHES_KEY = "arbiter_watches"
# A periodic resync of converged DecisionModels is off by default: every trigger that matters arrives as a watch event
# or as the plan's own requeue (promotion holds, rechecks while a condition is Unknown), and an idle operator should
# make no API or S3 requests (docs/benchmarks.md, idle cost). Namespace labels are watched (kube/namespaces.py); set it
# (seconds) only to catch what no watch reports.
RESYNC_ENV = "ARBITER_RESYNC_SECONDS"
WORKERS_ENV = "ARBITER_WORKERS"
# Passes in parallel. A pass is mostly waiting for the apiserver, so more workers than CPUs is what keeps a burst
# short (200 new DecisionModels on 2 cores: every InferenceService made in 13.9 s with 16, 20.2 s with 4; a version
# Ready 0.07 s after KServe's Ready at p95 with 16, 3.0 s with 4: docs/benchmarks.md).
DEFAULT_WORKERS = 16


def configure(settings: kopf.OperatorSettings) -> None:
    # kopf would post log lines as Events; Arbiter posts its own on transitions.
    settings.posting.enabled = False
    settings.networking.error_backoffs = RECONCILE_ERROR_BACKOFF.schedule(5)


async def _worker(queue: WorkQueue, reconciler: Reconciler, failures: dict[Key, int], leading: asyncio.Event,
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


@kopf.on.login()
def login(memo: kopf.Memo, logger: Any, settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: from --kubeconfig when given (the same file the clients load), else kopf's default
    (in-cluster, then $KUBECONFIG). Registering a login handler replaces kopf's defaults, hence the delegation."""
    path = memo.get(KUBECONFIG_KEY)
    if not path:
        return kopf.login_via_client(memo=memo, logger=logger, settings=settings, **kwargs)
    return connection_info(new_api_client(path).configuration, settings.networking.trust_env)


def connection_info(config: Any, trust_env: bool) -> kopf.ConnectionInfo:
    """A kubernetes.client.Configuration as kopf credentials (as kopf.login_via_client reads the default one)."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        trust_env=trust_env,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    if memo.get(IDLE_KEY):
        return
    queue = WorkQueue()
    leading = asyncio.Event()
    fence = None
    api = new_api_client(memo.get(KUBECONFIG_KEY))
    # Every request to the apiserver is made on this event loop (aiohttp): the reconcile's, the Lease's, the watches'.
    transport = memo["arbiter_transport"] = LoopTransport(api.configuration, asyncio.get_running_loop(),
                                                          user_agent=api.user_agent)
    election = memo.get(LEADER_KEY)
    if election:
        from .kube.leader import LeaderElector

        def started_leading() -> None:
            metrics.LEADER.set(1)
            leading.set()

        def lost() -> None:
            # Like client-go's controllers: exit, and come back (the kubelet restarts the container) as a standby.
            # The fence already refuses every write; nothing in memory needs saving (status is the state).
            metrics.LEADER.set(0)
            logging.shutdown()
            os._exit(1)

        elector = LeaderElector(transport, election["namespace"],
                                name=election.get("name") or "arbiter-operator-leader",
                                identity=election["identity"], lease_duration=election["lease_duration"],
                                renew_deadline=election["renew_deadline"], retry_period=election["retry_period"],
                                on_started_leading=started_leading, on_lost=lost)
        fence = elector.is_leader
        memo["arbiter_elector"] = elector
        log.info("leader election on: Lease %s/%s, identity %s", election["namespace"], elector.name, elector.identity)
        elector.start()
    else:
        metrics.LEADER.set(1)  # the only replica
        leading.set()
    # Reads of DecisionModels, children, predictor Deployments and namespace labels come from the watch cache.
    cache = memo[CACHE_KEY] = WatchCache({(a, k): label for a, k, _, label in CACHED})
    kube = CachedKubeClient(RestKubeClient(api, fence=fence, transport=transport), cache)
    try:  # the canary analyses' Prometheus (docs/operations.md, "Promotion metrics")
        prometheus: PrometheusClient | None = PrometheusClient(PrometheusConfig.from_env(os.environ))
    except Exception as exc:  # e.g. an unreadable CA file: serving goes on, promotion steps wait for an analysis
        log.error("cannot set up the Prometheus client (%s); promotion analyses cannot run", exc)
        prometheus = None
    reconciler = Reconciler(kube, prometheus=prometheus, runtime_image=runtime_image())
    failures: dict[Key, int] = {}
    memo[QUEUE_KEY] = queue
    # Namespace labels that change the rendering (mesh) are watched, per namespace holding DecisionModels.
    memo[NSWATCH_KEY] = NamespaceLabels(api.configuration, queue.add, cache=cache).start()
    watched = memo[WATCHES_KEY] = start_watches(memo, api.configuration, memo.get(NAMESPACES_KEY) or [])
    resync = float(os.environ.get(RESYNC_ENV, "0"))
    workers = max(1, int(os.environ.get(WORKERS_ENV, str(DEFAULT_WORKERS))))
    memo["arbiter_tasks"] = [asyncio.create_task(_worker(queue, reconciler, failures, leading, resync,
                                                         watched.primed)) for _ in range(workers)]


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("arbiter_tasks", []):
        task.cancel()
    if memo.get("arbiter_elector") is not None:  # hand the Lease back: the standby takes over at its next retry
        await memo["arbiter_elector"].stop()
    if memo.get(NSWATCH_KEY) is not None:
        await memo[NSWATCH_KEY].stop()
    if memo.get(WATCHES_KEY) is not None:  # a shard's restart starts new ones on the new namespace list
        await memo[WATCHES_KEY].stop()
    if memo.get("arbiter_transport") is not None:
        await memo["arbiter_transport"].close()


# The kinds held in the watch cache: (apiVersion, kind, plural, the label every held object carries or None), each
# listed and watched by the operator's watches (kube/watch.py, started in `startup`); no pass runs before every first
# list is held.
CACHED = (
    (API_VERSION, KIND, PLURAL, None),
    ("serving.kserve.io/v1beta1", "InferenceService", "inferenceservices", LABEL_DM),
    ("serving.kserve.io/v1alpha1", "ServingRuntime", "servingruntimes", LABEL_DM),
    ("route.openshift.io/v1", "Route", "routes", LABEL_DM),
    ("v1", "ConfigMap", "configmaps", LABEL_DM),
    ("v1", "Service", "services", LABEL_DM),
    (PODMONITOR_API, "PodMonitor", "podmonitors", LABEL_DM),
    ("apps/v1", "Deployment", "deployments", ISVC_LABEL),  # KServe's predictors (a version's readiness)
    ("v1", "Pod", "pods", ISVC_LABEL),  # their pods (why a version is not ready: unschedulable, crash loop)
)


def _settle(event: dict[str, Any], cache: WatchCache) -> bool:
    """Once no write to the object is in flight (WatchEvents waits for its answer): forget a deleted object; whether
    the event is the echo of the operator's own last write to that object."""
    obj = event.get("object") or {}
    if event.get("type") == "DELETED":
        meta = obj.get("metadata") or {}
        cache.discard(obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace"), meta.get("name", ""),
                      uid=meta.get("uid"))
        return False
    return cache.is_echo(obj)


ECHO_WAIT = 2.0


def _label_as_held(event: dict[str, Any], memo: kopf.Memo, label: str) -> str:
    """The value of `label` on the event's object, or, when the event is a DELETED whose object no longer carries it
    (someone removed the label: the label-selected watch reports the object as gone), on the object as the cache held
    it. Call it before `_settle`, which forgets the object on a deletion."""
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    value = (meta.get("labels") or {}).get(label)
    if value or event.get("type") != "DELETED":
        return value or ""
    held = memo[CACHE_KEY].get(obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace"),
                               meta.get("name", "")) or {}
    return ((held.get("metadata") or {}).get("labels") or {}).get(label) or ""


def _decisionmodel_event(event: dict[str, Any], namespace: str, memo: kopf.Memo) -> None:
    echo = _settle(event, memo[CACHE_KEY])
    name = event["object"]["metadata"]["name"]
    if event.get("type") == "DELETED":
        memo[NSWATCH_KEY].forget(namespace, name)
        return  # children go with it (owner references); a deletion the finalizer holds arrives as MODIFIED
    memo[NSWATCH_KEY].note(namespace, name)
    if echo:  # our own status or finalizer patch coming back: nothing in it the reconcile has not seen
        metrics.ECHOES_SKIPPED.inc()
        return
    memo[QUEUE_KEY].add((namespace, name))


def _child_event(event: dict[str, Any], namespace: str, memo: kopf.Memo) -> None:
    owner = _label_as_held(event, memo, LABEL_DM)  # deleted, or its label removed: the DecisionModel repairs it
    echo = _settle(event, memo[CACHE_KEY])
    # KServe's bookkeeping (other conditions, URLs, revisions) changes nothing a pass reads (the view is noted for
    # every event, echoes included, so the next one is compared with what the operator last saw).
    isvc = (event.get("object") or {}).get("kind") == "InferenceService"
    moved = not isvc or _ISVC_VIEWS.changed(event)
    if not owner or _kserves(event):
        return
    if echo:  # our own apply coming back (KServe's status updates and anybody's edits get a new resourceVersion)
        metrics.ECHOES_SKIPPED.inc()
        return
    if moved:
        # An InferenceService's view moves when KServe's verdict on the version does (or someone edited it): the
        # pass that routes traffic to a version just made ready goes ahead of a fleet's first passes.
        memo[QUEUE_KEY].add((namespace, owner), urgent=isvc)


def isvc_view(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What a reconcile reads of an InferenceService: KServe's verdict (plan/planner.py isvc_state: Ready, a failed
    load, the message) and what drift is judged on (the spec, by generation, and the metadata the operator applies).
    KServe rewrites its status several times while a predictor comes up; only a change of this view queues a pass."""
    meta = as_map(obj.get("metadata"))
    return (isvc_state(obj), meta.get("generation"), jsonfast.dumps(meta.get("labels"), sort_keys=True),
            jsonfast.dumps(meta.get("annotations"), sort_keys=True), jsonfast.dumps(meta.get("ownerReferences")),
            meta.get("deletionTimestamp"))


class LastSeen:
    """What a reconcile reads of each object of one kind (`view`), as last seen: an event wakes the DecisionModel
    only when that changed. A view of None (nothing to report, e.g. a pod without trouble) is not held, and a
    deletion is the view going to None."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self._held: dict[tuple[str, str], Any] = {}

    def changed(self, event: dict[str, Any]) -> bool:
        obj = as_map(event.get("object"))
        meta = as_map(obj.get("metadata"))
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        before = self._held.pop(key, None)
        now = None if event.get("type") == "DELETED" else self.view(obj)
        if now is not None:
            self._held[key] = now
        return bool(now != before)

    def seen(self, namespace: str, name: str) -> Any:
        """The view last seen of that object (None: none held)."""
        return self._held.get((namespace, name))


def _kserves(event: dict[str, Any]) -> bool:
    """Whether the event's object is KServe's (controlled by an InferenceService: the predictor's Service carries the
    InferenceService's labels, the operator's label among them). A pass reads nothing of it: no wake-up."""
    meta = as_map(as_map(event.get("object")).get("metadata"))
    return any(ref.get("controller") is True and ref.get("kind") == "InferenceService"
               for ref in as_maps(meta.get("ownerReferences")))


def _availability(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What the readiness of a version reads of its predictor Deployment (rollout steps in between change nothing).
    It counts only while KServe says the InferenceService is Ready (plan/planner.py `_workload_state`)."""
    st = as_map(as_map(obj).get("status"))
    conds = {c.get("type"): c.get("status") for c in as_maps(st.get("conditions"))}
    # Whether the Deployment controller has seen the latest spec: a version still proving it loaded counts only then
    # (plan/predictors.py deployment_available), so catching up must wake its DecisionModel too.
    generation = as_map(as_map(obj).get("metadata")).get("generation")
    observed = st.get("observedGeneration")
    seen = not isinstance(generation, int) or (isinstance(observed, int) and observed >= generation)
    return (bool(st.get("availableReplicas")), conds.get("Available"), seen)


def _replica_failure(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """Why the predictor's pods cannot be created (plan/predictors.py deployment_problem), read whatever KServe says."""
    problem = deployment_problem(obj)
    return None if problem is None else (problem.reason, problem.message)


def _trouble(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What the reconcile reads of one predictor pod (plan/predictors.py): its problem, if any."""
    problem = predictor_problem([obj]) if obj else None
    return None if problem is None else (problem.reason, problem.message, problem.failed)


_ISVC_VIEWS = LastSeen(isvc_view)
_AVAILABILITY = LastSeen(_availability)  # per predictor Deployment
_REPLICA_FAILURE = LastSeen(_replica_failure)  # per predictor Deployment whose pods cannot be created
_TROUBLE = LastSeen(_trouble)  # per predictor pod in trouble


def _queue_owner(memo: kopf.Memo, namespace: str, isvc: str, only_if_ready: bool = False) -> None:
    """Queue the DecisionModel of InferenceService `isvc` in the urgent lane; only_if_ready: only while KServe says
    it is Ready."""
    # Read without decoding the InferenceService (this runs for a fleet's Deployment and pod events): its labels as
    # the cache holds them, KServe's verdict as its last event showed it (noted for every event, in order).
    labels = memo[CACHE_KEY].labels("serving.kserve.io/v1beta1", "InferenceService", namespace, isvc)
    if labels is None:
        return
    if only_if_ready:
        view = _ISVC_VIEWS.seen(namespace, isvc)
        if view is None or not view[0][1]:  # isvc_view's first part is isvc_state: (exists, ready, ...)
            return
    owner = labels.get(LABEL_DM)
    if owner:
        memo[QUEUE_KEY].add((namespace, owner), urgent=True)  # the version's serving state moved (WorkQueue)


def _pod_event(event: dict[str, Any], namespace: str, memo: kopf.Memo) -> None:
    """A predictor pod: its DecisionModel is queued only when the pod's trouble changed (it cannot be scheduled, it
    crash-loops, it got better or went away): what a loading version's Serving condition reports, and what the
    promotion machine rolls back on. A pod's other changes (start-up steps, readiness: KServe's status and the
    Deployment say that) queue nothing. This replaces polling while a version loads."""
    isvc = _label_as_held(event, memo, ISVC_LABEL)
    _settle(event, memo[CACHE_KEY])
    if _TROUBLE.changed(event):
        _queue_owner(memo, namespace, isvc)


def _deployment_event(event: dict[str, Any], namespace: str, memo: kopf.Memo) -> None:
    """A predictor Deployment (KServe's): its DecisionModel is queued when the reason its pods cannot be created
    changed, or when its availability changed while KServe says the InferenceService is Ready (a version is ready on
    KServe's Ready and an available replica: whichever the operator sees last wakes it; before KServe's Ready the
    replicas coming up change nothing a pass reports, and KServe's Ready, when it comes, wakes it)."""
    isvc = _label_as_held(event, memo, ISVC_LABEL)
    _settle(event, memo[CACHE_KEY])
    failure = _REPLICA_FAILURE.changed(event)  # both views are noted on every event: no short-circuit
    availability = _AVAILABILITY.changed(event)
    if failure or availability:
        _queue_owner(memo, namespace, isvc, only_if_ready=not failure)


# The operator's watches (kube/watch.py): every kind of CACHED, with the same label selectors.
WATCHED = tuple(Resource(a, k, p, label) for a, k, p, label in CACHED)
CHILDREN = tuple(r for r in WATCHED if r.kind != KIND)
_EVENTS = {KIND: _decisionmodel_event, "Deployment": _deployment_event, "Pod": _pod_event}  # the rest: _child_event


class WatchEvents:
    """The watch events into the cache and the work queue, in the order they arrived per object. An event of an
    object the operator is writing waits (up to ECHO_WAIT, off the watch's task) for the write's answer, which says
    whether it is an echo; that object's later events queue up behind it."""

    def __init__(self, memo: kopf.Memo) -> None:
        self.memo = memo
        self.cache: WatchCache = memo[CACHE_KEY]
        self._behind: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def event(self, resource: Resource, type_: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (resource.api_version, resource.kind, meta["namespace"], meta["name"])
        event = {"type": type_, "object": obj}
        if type_ != "DELETED":
            self.cache.put(obj)  # held at once (a newer write-through is kept), judged below
        behind = self._behind.get(key)
        if behind is not None:
            behind.append(event)
        elif type_ != "DELETED" and self.cache.writing(obj):
            self._behind[key] = [event]
            task = asyncio.get_running_loop().create_task(self._after_write(key, obj))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._handle(event)

    def known(self, resource: Resource, namespace: str, name: str, resource_version: str) -> bool:
        """Whether the cache holds that object at exactly that resourceVersion: its ADDED or MODIFIED then carries
        nothing new (most often the echo of the operator's own write, whose answer is held already). For the kinds
        in ECHOING only (kube/watch.py reads their events' names and resourceVersions first): an InferenceService's
        echo still goes through, since its view is noted for every event (`_child_event`)."""
        key = (resource.api_version, resource.kind, namespace, name)
        if not self.cache.holds_version(key, resource_version):
            return False
        if self.cache.wrote_version(key, resource_version):
            metrics.ECHOES_SKIPPED.inc()
        return True

    async def _after_write(self, key: tuple[str, str, str, str], obj: dict[str, Any]) -> None:
        waited = 0.0
        while self.cache.writing(obj) and waited < ECHO_WAIT:
            await asyncio.sleep(0.01)
            waited += 0.01
        for event in self._behind.pop(key, []):
            self._handle(event)

    def _handle(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        try:
            _EVENTS.get(obj["kind"], _child_event)(event, obj["metadata"]["namespace"], self.memo)
        except Exception:  # a defect: the event is lost, the watch goes on
            log.exception("handling a %s event of %s %s failed", event["type"], obj["kind"], obj["metadata"]["name"])

    def listed(self, resource: Resource, namespace: str | None, objs: list[dict[str, Any]], rv: str) -> None:
        """A full list of one kind in one scope (the first, or after the watch lost its place): what it holds goes
        in like a watch event when it is new; what the cache holds and the list does not left meanwhile, and goes
        as a DELETED would (its DecisionModel repairs it), unless it is newer than the list (a write since)."""
        listed = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        held = {((h.get("metadata") or {}).get("namespace") or "", (h.get("metadata") or {}).get("name") or ""): h
                for h in self.cache.list(resource.api_version, resource.kind, namespace, [])}
        list_rv = _int(rv)

        def newer_own_write(obj: dict[str, Any]) -> bool:  # the answer to a write made after the list was served
            held_rv = _int((obj.get("metadata") or {}).get("resourceVersion"))
            return (held_rv is not None and list_rv is not None and held_rv > list_rv
                    and self.cache.is_echo(obj))

        for key, obj in held.items():
            if key not in listed and not newer_own_write(obj):
                self.event(resource, "DELETED", obj)
        for key, obj in listed.items():
            before = held.get(key)
            if before is not None and (before.get("metadata") or {}).get("resourceVersion") == \
                    obj["metadata"].get("resourceVersion"):
                continue  # unchanged while the watch was away
            if before is not None and not newer_own_write(before):
                # The list is the truth: what is held goes even if it claims a later resourceVersion (an event
                # that claimed one the apiserver never reached would otherwise pin it for good).
                meta = before.get("metadata") or {}
                self.cache.discard(resource.api_version, resource.kind, key[0], key[1], uid=meta.get("uid"))
            self.event(resource, "MODIFIED" if before else "ADDED", obj)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class OperatorWatches:
    """The operator's watches and their event glue, started and stopped together."""

    def __init__(self, events: WatchEvents, watches: Watches) -> None:
        self.events, self.watches = events, watches
        self.primed = watches.primed

    async def stop(self) -> None:
        await self.watches.stop()
        await self.events.stop()


# The kinds whose watch events are mostly echoes of the operator's own writes (its status patches, its applies of
# children nobody else writes): each event's name and resourceVersion are read first, and one the cache holds as it is
# goes no further (WatchEvents.known). Not InferenceServices (KServe writes their status; the view of each event is
# noted), nor KServe's Deployments and pods (the operator never writes them).
ECHOING = frozenset({KIND, "ServingRuntime", "Route", "ConfigMap", "Service", "PodMonitor"})


def watches_for(events: WatchEvents, config: Any, resources: list[Resource], namespaces: list[str],
                options: WatchOptions | None = None) -> Watches:
    """The watches of `resources` feeding `events` (not started)."""
    return Watches(config, resources, namespaces, events.event, events.listed, options, known=events.known,
                   skim=ECHOING)


def start_watches(memo: kopf.Memo, config: Any, namespaces: list[str], options: WatchOptions | None = None,
                  resources: tuple[Resource, ...] = WATCHED) -> OperatorWatches:
    """List and watch DecisionModels and every child kind, cluster-wide or in each of `namespaces`."""
    events = WatchEvents(memo)
    return OperatorWatches(events, watches_for(events, config, list(resources), namespaces, options).start())
