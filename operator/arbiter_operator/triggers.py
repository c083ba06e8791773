"""What wakes a reconcile: the operator's watch events (kube/watch.py) go into the watch cache, and, where a pass
would find something new, the owning DecisionModel's key into the work queue (kube/workqueue.py).

One `Triggers` per operator run holds the queue, the cache and what it last saw of each object (`LastSeen` views):
a shard that restarts on a new namespace list starts a new one, so nothing seen by the old run wakes the new one.

The rules, by kind:
  DecisionModel     queued unless the event is the echo of the operator's own status or finalizer patch;
  child             its owner (by label) queued when a pass would find it changed (not an echo, not KServe's object);
                    an InferenceService only when its view changed (KServe's verdict, what drift is judged on), and
                    then in the urgent lane;
  predictor         KServe's Deployment: when why its pods cannot be created changed, or its availability while KServe
                    says the InferenceService is Ready; its pods: when their trouble changed (urgent lane).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from . import metrics
from .api.names import ISVC_API, ISVC_LABEL, KIND, LABEL_DM
from .kube.cache import WatchCache
from .kube.watch import Resource
from .kube.workqueue import PriorityWorkQueue
from .plan.predictors import as_map, as_maps, deployment_problem, predictor_problem
from .plan.versions import isvc_state

log = logging.getLogger("arbiter.triggers")

Event = dict[str, Any]  # {"type": ADDED | MODIFIED | DELETED, "object": the object}
ObjectKey = tuple[str, str, str, str]  # apiVersion, kind, namespace, name

# Seconds an event of an object the operator is writing waits for the write's answer, which says whether it is an
# echo (a write's answer can come after its watch event on a busy machine).
ECHO_WAIT = 2.0


class NamespaceNotes(Protocol):
    """The namespaces holding DecisionModels (their labels are watched: they change the rendering)."""

    def note(self, namespace: str, name: str) -> None: ...
    def forget(self, namespace: str, name: str) -> None: ...


class LastSeen:
    """What a reconcile reads of each object of one kind (`view`), as last seen: an event wakes the DecisionModel
    only when that changed. A view of None (nothing to report, e.g. a pod without trouble) is not held, and a
    deletion is the view going to None."""

    def __init__(self, view: Callable[[Any], Any]) -> None:
        self.view = view
        self._held: dict[tuple[str, str], Any] = {}

    def changed(self, event: Event) -> bool:
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


def isvc_view(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What a reconcile reads of an InferenceService: KServe's verdict (plan/versions.py isvc_state: Ready, a failed
    load, the message) and what drift is judged on (the spec, by generation, and the metadata the operator applies).
    KServe rewrites its status several times while a predictor comes up; only a change of this view queues a pass.
    The metadata is held as decoded (each event's object is a fresh decode nobody changes afterwards): comparing it
    is what the view is for; encoding it per event to compare strings took about 40% of its time (12 us -> 7 us)."""
    meta = as_map(obj.get("metadata"))
    return (isvc_state(obj), meta.get("generation"), meta.get("labels"), meta.get("annotations"),
            meta.get("ownerReferences"), meta.get("deletionTimestamp"))


def availability(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What the readiness of a version reads of its predictor Deployment (rollout steps in between change nothing).
    It counts only while KServe says the InferenceService is Ready (plan/versions.py `_workload_state`)."""
    st = as_map(as_map(obj).get("status"))
    conds = {c.get("type"): c.get("status") for c in as_maps(st.get("conditions"))}
    # Whether the Deployment controller has seen the latest spec: a version still proving it loaded counts only then
    # (plan/predictors.py deployment_available), so catching up must wake its DecisionModel too.
    generation = as_map(as_map(obj).get("metadata")).get("generation")
    observed = st.get("observedGeneration")
    seen = not isinstance(generation, int) or (isinstance(observed, int) and observed >= generation)
    return (bool(st.get("availableReplicas")), conds.get("Available"), seen)


def replica_failure(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """Why the predictor's pods cannot be created (plan/predictors.py deployment_problem), read whatever KServe says."""
    problem = deployment_problem(obj)
    return None if problem is None else (problem.reason, problem.message)


def trouble(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What the reconcile reads of one predictor pod (plan/predictors.py): its problem, if any."""
    problem = predictor_problem([obj]) if obj else None
    return None if problem is None else (problem.reason, problem.message, problem.failed)


def kserves(event: Event) -> bool:
    """Whether the event's object is KServe's (controlled by an InferenceService: the predictor's Service carries the
    InferenceService's labels, the operator's label among them). A pass reads nothing of it: no wake-up."""
    meta = as_map(as_map(event.get("object")).get("metadata"))
    return any(ref.get("controller") is True and ref.get("kind") == "InferenceService"
               for ref in as_maps(meta.get("ownerReferences")))


class Triggers:
    """The watch events into the cache and the work queue, in the order they arrived per object. An event of an
    object the operator is writing waits (up to ECHO_WAIT, off the watch's task) for the write's answer, which says
    whether it is an echo; that object's later events queue up behind it.

    `event`, `listed` and `known` are the callbacks of kube/watch.py's Watches."""

    def __init__(self, queue: PriorityWorkQueue, cache: WatchCache, namespaces: NamespaceNotes | None = None) -> None:
        self.queue = queue
        self.cache = cache
        self.namespaces = namespaces  # None: no namespace labels followed (a test of the child rules)
        self.isvc_views = LastSeen(isvc_view)
        self.availability = LastSeen(availability)  # per predictor Deployment
        self.replica_failure = LastSeen(replica_failure)  # per predictor Deployment whose pods cannot be created
        self.trouble = LastSeen(trouble)  # per predictor pod in trouble
        self._rules: dict[str, Callable[[Event, str], None]] = {
            KIND: self.decisionmodel_event, "Deployment": self.deployment_event, "Pod": self.pod_event}
        self._behind: dict[ObjectKey, list[Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the watches' callbacks -----------------------------------------------------------------------------------
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
        echo still goes through, since its view is noted for every event (`child_event`)."""
        key = (resource.api_version, resource.kind, namespace, name)
        if not self.cache.holds_version(key, resource_version):
            return False
        if self.cache.wrote_version(key, resource_version):
            metrics.ECHOES_SKIPPED.inc()
        return True

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

    async def _after_write(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        waited = 0.0
        while self.cache.writing(obj) and waited < ECHO_WAIT:
            await asyncio.sleep(0.01)
            waited += 0.01
        for event in self._behind.pop(key, []):
            self._handle(event)

    def _handle(self, event: Event) -> None:
        obj = event["object"]
        try:
            self._rules.get(obj["kind"], self.child_event)(event, obj["metadata"]["namespace"])
        except Exception:  # a defect: the event is lost, the watch goes on
            log.exception("handling a %s event of %s %s failed", event["type"], obj["kind"], obj["metadata"]["name"])

    # -- the rules ------------------------------------------------------------------------------------------------
    def decisionmodel_event(self, event: Event, namespace: str) -> None:
        echo = self._settle(event)
        name = event["object"]["metadata"]["name"]
        if event.get("type") == "DELETED":
            if self.namespaces is not None:
                self.namespaces.forget(namespace, name)
            return  # children go with it (owner references); a deletion the finalizer holds arrives as MODIFIED
        if self.namespaces is not None:
            self.namespaces.note(namespace, name)
        if echo:  # our own status or finalizer patch coming back: nothing in it the reconcile has not seen
            metrics.ECHOES_SKIPPED.inc()
            return
        self.queue.add((namespace, name))

    def child_event(self, event: Event, namespace: str) -> None:
        owner = self._label_as_held(event, LABEL_DM)  # deleted, or its label removed: the DecisionModel repairs it
        echo = self._settle(event)
        # KServe's bookkeeping (other conditions, URLs, revisions) changes nothing a pass reads (the view is noted
        # for every event, echoes included, so the next one is compared with what the operator last saw).
        isvc = (event.get("object") or {}).get("kind") == "InferenceService"
        moved = not isvc or self.isvc_views.changed(event)
        if not owner or kserves(event):
            return
        if echo:  # our own apply coming back (KServe's status updates and anybody's edits get a new resourceVersion)
            metrics.ECHOES_SKIPPED.inc()
            return
        if moved:
            # An InferenceService's view moves when KServe's verdict on the version does (or someone edited it): the
            # pass that routes traffic to a version just made ready goes ahead of a fleet's first passes.
            self.queue.add((namespace, owner), urgent=isvc)

    def pod_event(self, event: Event, namespace: str) -> None:
        """A predictor pod: its DecisionModel is queued only when the pod's trouble changed (it cannot be scheduled,
        it crash-loops, it got better or went away): what a loading version's Serving condition reports, and what
        the promotion machine rolls back on. A pod's other changes (start-up steps, readiness: KServe's status and
        the Deployment say that) queue nothing. This replaces polling while a version loads."""
        isvc = self._label_as_held(event, ISVC_LABEL)
        self._settle(event)
        if self.trouble.changed(event):
            self._queue_owner(namespace, isvc)

    def deployment_event(self, event: Event, namespace: str) -> None:
        """A predictor Deployment (KServe's): its DecisionModel is queued when the reason its pods cannot be created
        changed, or when its availability changed while KServe says the InferenceService is Ready (a version is
        ready on KServe's Ready and an available replica: whichever the operator sees last wakes it; before KServe's
        Ready the replicas coming up change nothing a pass reports, and KServe's Ready, when it comes, wakes it)."""
        isvc = self._label_as_held(event, ISVC_LABEL)
        self._settle(event)
        failure = self.replica_failure.changed(event)  # both views are noted on every event: no short-circuit
        available = self.availability.changed(event)
        if failure or available:
            self._queue_owner(namespace, isvc, only_if_ready=not failure)

    def _queue_owner(self, namespace: str, isvc: str, only_if_ready: bool = False) -> None:
        """Queue the DecisionModel of InferenceService `isvc` in the urgent lane; only_if_ready: only while KServe
        says it is Ready."""
        # Read without decoding the InferenceService (this runs for a fleet's Deployment and pod events): its labels
        # as the cache holds them, KServe's verdict as its last event showed it (noted for every event, in order).
        labels = self.cache.labels(ISVC_API, "InferenceService", namespace, isvc)
        if labels is None:
            return
        if only_if_ready:
            view = self.isvc_views.seen(namespace, isvc)
            if view is None or not view[0][1]:  # isvc_view's first part is isvc_state: (exists, ready, ...)
                return
        owner = labels.get(LABEL_DM)
        if owner:
            self.queue.add((namespace, owner), urgent=True)  # the version's serving state moved

    def _settle(self, event: Event) -> bool:
        """Once no write to the object is in flight (`event` waits for its answer): forget a deleted object; whether
        the event is the echo of the operator's own last write to that object."""
        obj = event.get("object") or {}
        if event.get("type") == "DELETED":
            meta = obj.get("metadata") or {}
            self.cache.discard(obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace"),
                               meta.get("name", ""), uid=meta.get("uid"))
            return False
        return self.cache.is_echo(obj)

    def _label_as_held(self, event: Event, label: str) -> str:
        """The value of `label` on the event's object, or, when the event is a DELETED whose object no longer carries
        it (someone removed the label: the label-selected watch reports the object as gone), on the object as the
        cache held it. Call it before `_settle`, which forgets the object on a deletion."""
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(label)
        if value or event.get("type") != "DELETED":
            return value or ""
        held = self.cache.get(obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace"),
                              meta.get("name", "")) or {}
        return ((held.get("metadata") or {}).get("labels") or {}).get(label) or ""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
