"""The operator's watches (kube/watch.py, fed into the cache and the work queue by triggers.Triggers) against a
hostile apiserver (support/hostile_apiserver.py, a real HTTP server on loopback speaking the list/watch wire format
for DecisionModels, InferenceServices and pods, and the Namespaces the namespace watch follows).

What a user would notice, whatever the peer does for a while (garbage and truncated lines, events that are not
objects or whose object has the wrong shape, lying events, ERROR events, 410 on a watch and on a list's continue,
error statuses, resets and cut streams, hangs, bookmarks, slow answers) and then behaving again: the cache holds
exactly the peer's objects that the watches select (by kind, namespace, name and resourceVersion), the watches still
run and no exception escaped. Objects gone while the watch was away leave the cache and wake their DecisionModel.
No pass runs before every kind's first list is held.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from arbiter_operator import app
from arbiter_operator.api.names import API_VERSION, ISVC_LABEL, KIND
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.kinds import ECHOING
from arbiter_operator.kube.watch import Watches, WatchOptions
from arbiter_operator.kube.workqueue import PriorityWorkQueue as WorkQueue
from arbiter_operator.render.common import LABEL_DM
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from support.hostile_apiserver import ENDS, GARBAGE_LISTS, STATUS_BODIES, TRANSPORT, HostileApiserver, module_peer
from support.watch_rig import FAST_BACKOFF, new_triggers, served, stop_triggers

KINDS = served("inferenceservices", "pods", "decisionmodels")
RESOURCES = [r for r in app.WATCHED if r.plural in KINDS]
LABEL = {"inferenceservices": LABEL_DM, "pods": ISVC_LABEL, "decisionmodels": None}  # None: watched unfiltered
MAX_BYTES = 256 * 1024
OPTIONS = WatchOptions(timeout_seconds=1, connect_timeout=1.0, read_timeout=1.3, list_timeout=2.0, page_size=2,
                       max_page_bytes=MAX_BYTES, max_event_bytes=MAX_BYTES, healthy_after=0.3, relist_after=2,
                       backoff=FAST_BACKOFF)
HOSTILE_S = 1.0
CONVERGE_S = 20.0
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])
NAMESPACES = ("ns-a", "ns-b", "ns-c")
NAMES = ("m1", "m2", "m3")

peer = module_peer(hang_s=2.0, kinds=KINDS)


ref_st = st.tuples(st.sampled_from(sorted(KINDS)), st.sampled_from(NAMESPACES), st.sampled_from(NAMES))
owner_st = st.sampled_from(("dm-one", "dm-two"))


@st.composite
def labels_for(draw: Any, plural: str) -> dict[str, str]:
    labels = {"app": draw(st.sampled_from(("x", "y")))}
    label = LABEL[plural]
    if label and (draw(st.booleans()) or draw(st.booleans())):  # mostly selected; some not (not to be held)
        labels[label] = draw(owner_st)
    return labels


truth_st = st.lists(ref_st, max_size=8, unique=True).flatmap(
    lambda refs: st.tuples(*[labels_for(r[0]) for r in refs]).map(lambda ls: dict(zip(refs, ls, strict=True))))
change_st = ref_st.flatmap(lambda r: st.tuples(st.just(r), st.one_of(st.none(), labels_for(r[0]))))

json_st = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                    max_size=3), max_leaves=8)


@st.composite
def lying_object(draw: Any) -> dict[str, Any]:
    plural, ns, name = draw(ref_st)
    api_version, kind = KINDS[plural]
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": ns, "labels": draw(labels_for(plural)),
                         "resourceVersion": str(draw(st.integers(1, 10**12)))}}


def _line(doc: Any) -> bytes:
    return json.dumps(doc).encode()


event_line_st = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),  # garbage
    st.sampled_from([b"[]", b"null", b"5", b'"ADDED"', b'{"type": "ADDED"', b"{}"]),  # not an event, truncated
    json_st.map(lambda o: _line({"type": "ADDED", "object": o})),  # an object of the wrong shape
    st.builds(lambda t, o: _line({"type": t, "object": o}), st.sampled_from(["ADDED", "MODIFIED", "DELETED", "x", 5]),
              st.fixed_dictionaries({"metadata": json_st})),
    st.builds(lambda c: _line({"type": "ERROR", "object": {"kind": "Status", "code": c}}),
              st.sampled_from([410, 500, 403, "x"])),
    st.builds(lambda rv: _line({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}),
              st.one_of(st.text(max_size=6), st.integers())),
    st.builds(lambda t, o: _line({"type": t, "object": o}), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
              lying_object()),  # well-formed lies: the relist must undo them
)
STATUS_CODES = (500, 502, 503, 504, 410, 429, 401, 403)  # 404 on a first list means "not served" (kube/watch.py)
behaviour_st = st.one_of(
    st.sampled_from(TRANSPORT).map(lambda t: (t,)),
    st.tuples(st.just("status"), st.sampled_from(STATUS_CODES),
              st.sampled_from(sorted(STATUS_BODIES)), st.sampled_from([None, "0", "0.1", "x", "-3"])),
    st.tuples(st.just("list_body"), st.sampled_from(GARBAGE_LISTS)),
    st.tuples(st.just("slow"), st.sampled_from([0.2, 0.6])),
    st.tuples(st.just("events"), st.lists(event_line_st, max_size=6), st.sampled_from(ENDS)),
    st.just(("honest",)),
)


def selected(peer: HostileApiserver, scopes: list[str]) -> dict[tuple[str, str, str], str]:
    """The peer's objects the watches select: the kind's label present, in a watched namespace (all: [])."""
    with peer._lock:
        truth = {ref: dict(labels) for ref, labels in peer.truth.items() if not isinstance(ref, str)}
    objects = peer.objects()
    return {(KINDS[p][1], ns, name): objects[(KINDS[p][1], ns, name)] for (p, ns, name), labels in truth.items()
            if (LABEL[p] is None or LABEL[p] in labels) and (not scopes or ns in scopes)}


def held(cache: WatchCache) -> dict[tuple[str, str, str], str]:
    out = {}
    for r in RESOURCES:
        for obj in cache.list(r.api_version, r.kind, None, []):
            meta = obj["metadata"]
            out[(r.kind, meta["namespace"], meta["name"])] = meta.get("resourceVersion")
    return out


async def _converged(cache: WatchCache, peer: HostileApiserver, scopes: list[str], watches: Watches) -> bool:
    """Every kind listed once, and the cache holding what the peer selects."""
    deadline = time.monotonic() + CONVERGE_S
    while time.monotonic() < deadline:
        if watches.primed.is_set() and held(cache) == selected(peer, scopes):
            return True
        await asyncio.sleep(0.05)
    return False


LIE = _line({"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "m1", "namespace": "ns-a", "labels": {ISVC_LABEL: "lie"}, "resourceVersion": "999999999999"}}})


@SETTINGS
@example(start={("pods", "ns-a", "m1"): {ISVC_LABEL: "m1"}}, script=[("events", [LIE], "end")], changes=[],
         final={("pods", "ns-a", "m1"): {ISVC_LABEL: "m1"}}, scoped=False)  # a lie no later event outranks
@given(start=truth_st, script=st.lists(behaviour_st, min_size=1, max_size=8), changes=st.lists(change_st, max_size=5),
       final=truth_st, scoped=st.booleans())
def test_the_cache_holds_the_peers_objects_once_it_behaves(peer, start, script, changes, final, scoped):
    scopes = ["ns-a", "ns-b"] if scoped else []
    errors: list[Any] = []

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        events = new_triggers(peer)
        cache = events.cache
        peer.go_honest(start)
        peer.set_script(script)
        watches = app.watches_for(events, peer.configuration(), RESOURCES, scopes, OPTIONS).start()
        try:
            for ref, labels in changes:
                await asyncio.sleep(HOSTILE_S / (len(changes) + 1))
                peer.put(ref, labels)
            await asyncio.sleep(HOSTILE_S / (len(changes) + 1))
            peer.go_honest(final)
            assert await _converged(cache, peer, scopes, watches), (held(cache), selected(peer, scopes))
            assert watches.running  # every task still follows its kind
            assert all(not t.done() for t in watches._tasks.values())
        finally:
            await watches.stop()
            await stop_triggers(events)

    asyncio.run(run())
    assert not errors  # no exception escaped a task


def test_objects_gone_while_the_watch_was_away_leave_the_cache_and_wake_their_model(peer):
    """A pod and an InferenceService deleted (and one relabelled out) while the watch was cut, with the history
    compacted: the watch gets 410, lists again, and each DecisionModel that lost a child is queued (a healthy pod that
    went wakes nobody, as its DELETED would not: pods wake their model when their trouble changes)."""
    isvc = ("inferenceservices", "ns-a", "m1")
    pod = ("pods", "ns-b", "m2")
    relabelled = ("inferenceservices", "ns-a", "m3")
    kept = ("inferenceservices", "ns-c", "m1")

    async def run() -> None:
        events = new_triggers(peer)
        cache = events.cache
        peer.go_honest({isvc: {LABEL_DM: "dm-one"}, kept: {LABEL_DM: "dm-kept"}, relabelled: {LABEL_DM: "dm-three"},
                        pod: {ISVC_LABEL: "m1"}, ("inferenceservices", "ns-b", "m1"): {LABEL_DM: "dm-two"}})
        watches = app.watches_for(events, peer.configuration(), RESOURCES, [], OPTIONS).start()
        try:
            assert await _converged(cache, peer, [], watches)
            queue = events.queue = WorkQueue()  # from now on: what the outage wakes
            peer.set_script([("status", 503, "status", None)] * 4)  # away for a while, then 410 on the old version
            peer.go_honest({kept: {LABEL_DM: "dm-kept"}, relabelled: {"other": "x"},
                            ("inferenceservices", "ns-b", "m1"): {LABEL_DM: "dm-two"}})
            assert await _converged(cache, peer, [], watches)
            assert cache.get("v1", "Pod", "ns-b", "m2") is None
            assert ("ns-a", "dm-one") in queue._pending  # its InferenceService went
            assert ("ns-a", "dm-three") in queue._pending  # its InferenceService lost the label: as if deleted
            assert ("ns-b", "dm-two") not in queue._pending  # its pod went, healthy: a pod wakes on trouble only
            assert ("ns-c", "dm-kept") not in queue._pending  # nothing of it changed
        finally:
            await watches.stop()
            await stop_triggers(events)

    asyncio.run(run())


def test_no_pass_runs_before_every_kinds_first_list_is_held(peer):
    """The workers are gated on the first lists: with the peer's list answers slow, a DecisionModel queued at once
    is reconciled only after every kind's list is in the cache, and then it is."""
    class Recorder:  # the pass: records what the cache held when it ran
        def __init__(self, cache: WatchCache) -> None:
            self.cache, self.saw = cache, []

        async def reconcile(self, namespace: str, name: str) -> None:
            self.saw.append(held(self.cache))
            return None

    truth = {("inferenceservices", ns, "m1"): {LABEL_DM: "dm"} for ns in NAMESPACES}
    truth.update({("pods", ns, "m1"): {ISVC_LABEL: "m1"} for ns in NAMESPACES})

    async def run() -> None:
        events = new_triggers(peer)
        cache = events.cache
        peer.go_honest(truth)
        peer.set_script([("slow", 0.6)], cycle=True)  # every list and watch answers late
        watches = app.watches_for(events, peer.configuration(), RESOURCES, list(NAMESPACES),
                                       OPTIONS).start()
        recorder = Recorder(cache)
        leading = asyncio.Event()
        leading.set()
        queue = events.queue
        queue.add(("ns-a", "dm"))
        worker = asyncio.create_task(app.worker(queue, recorder, {}, leading, 0, watches.primed))
        try:
            deadline = time.monotonic() + CONVERGE_S
            while not recorder.saw and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert recorder.saw, "the pass never ran"
            assert recorder.saw[0] == selected(peer, list(NAMESPACES))  # the first pass saw every child
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await watches.stop()
            await stop_triggers(events)
            peer.set_script([])

    asyncio.run(run())


def test_a_watch_that_goes_silent_is_given_up_within_its_read_timeout(peer):
    """A watch answered with headers and then nothing (a proxy that stalls, a peer that hangs) is abandoned after
    about `read_timeout` of silence, long before the watch's own deadline, and the next one brings a change made
    meanwhile."""
    options = WatchOptions(timeout_seconds=60, connect_timeout=1.0, read_timeout=1.0, list_timeout=2.0,
                           healthy_after=0.3, relist_after=2, backoff=FAST_BACKOFF)
    pod = ("pods", "ns-a", "m1")

    async def run() -> float:
        events = new_triggers(peer)
        peer.go_honest({pod: {ISVC_LABEL: "m1"}})
        pods = [r for r in RESOURCES if r.plural == "pods"]
        watches = app.watches_for(events, peer.configuration(), pods, [], options).start()
        hang = peer.hang_s
        try:
            await watches.primed.wait()
            peer.hang_s = 60.0
            peer.set_script([("events", [], "hang")], cycle=False)  # cuts the open watch; the next one stalls
            await asyncio.sleep(0.5)
            started = time.monotonic()
            peer.put(("pods", "ns-a", "m2"), {ISVC_LABEL: "m2"})  # made while the watch hears nothing
            while time.monotonic() - started < 20:
                if events.cache.get("v1", "Pod", "ns-a", "m2") is not None:
                    return time.monotonic() - started
                await asyncio.sleep(0.05)
            return float("inf")
        finally:
            peer.hang_s = hang
            await watches.stop()
            await stop_triggers(events)
            peer.set_script([])

    seen_after = asyncio.run(run())
    assert seen_after < 1.0 * 1.25 + 2.0  # the silence noticed (within 1.25 x read_timeout), then a back-off


def test_an_event_of_an_object_held_as_it_is_goes_no_further(peer):
    """For the kinds whose events are mostly the echoes of the operator's own writes, an ADDED or MODIFIED of an
    object the caller holds at exactly that resourceVersion is not decoded nor handed on (whatever else the line
    holds); the same object at another resourceVersion, a deletion, and other objects are."""
    dms = [r for r in RESOURCES if r.kind == KIND]
    seen: list[tuple[str, str, str]] = []

    def on_event(_resource: Any, type_: str, obj: dict[str, Any]) -> None:
        seen.append((type_, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    def dm_line(type_: str, name: str, rv: str, **extra: Any) -> bytes:
        return _line({"type": type_, "object": {"apiVersion": API_VERSION, "kind": KIND, "metadata": {
            "name": name, "namespace": "ns-a", "resourceVersion": rv}, **extra}})

    held_as_it_is = {("ns-a", "m1", "500")}
    script = [dm_line("MODIFIED", "m1", "500", status={"phase": "x" * 100}),  # held: goes no further
              _line({"type": "MODIFIED", "object": {"metadata": {"name": "m1", "namespace": "ns-a",
                                                                 "resourceVersion": "500"}, "spec": "garbage"}}),
              dm_line("MODIFIED", "m1", "501"),  # the same object, changed since
              dm_line("MODIFIED", "m2", "500"),  # another object
              dm_line("DELETED", "m1", "500")]  # a deletion always goes on

    async def run() -> None:
        peer.go_honest({})
        peer.set_script([("honest",), ("events", script, "hang")], cycle=False)  # the list, then the watch
        watches = Watches(peer.configuration(), dms, [], on_event, lambda *_: None, OPTIONS,
                          known=lambda _r, ns, name, rv: (ns, name, rv) in held_as_it_is, skim=ECHOING)
        watches.start()
        try:
            deadline = time.monotonic() + CONVERGE_S
            while len(seen) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            await watches.stop()

    asyncio.run(run())
    assert seen[:3] == [("MODIFIED", "m1", "501"), ("MODIFIED", "m2", "500"), ("DELETED", "m1", "500")]


def test_the_echo_of_the_operators_own_write_is_counted_and_wakes_nothing(peer):
    """Through the product's wiring (app.watches_for): the watch event of a DecisionModel's status write, held
    already from the write's answer, queues no pass and counts as an echo; someone else's change after it queues one."""
    from arbiter_operator import metrics

    ref = ("decisionmodels", "ns-a", "m1")

    async def run() -> None:
        events = new_triggers(peer)
        cache = events.cache
        peer.go_honest({ref: {"app": "x"}})
        watches = app.watches_for(events, peer.configuration(), [r for r in RESOURCES if r.kind == KIND], [],
                                       OPTIONS).start()
        try:
            assert await _converged(cache, peer, [], watches)
            queue = events.queue = WorkQueue()
            held_dm = cache.get(API_VERSION, KIND, "ns-a", "m1")
            assert held_dm is not None
            answer = {**held_dm, "metadata": {**held_dm["metadata"], "resourceVersion": str(peer.rv + 1)}}
            cache.wrote(answer)  # the answer to a status write, resourceVersion rv + 1
            echoes = metrics.ECHOES_SKIPPED._value.get()
            peer.put(ref, {"app": "x", "status": "written"})  # the peer's next change: rv + 1, the write's echo
            deadline = time.monotonic() + CONVERGE_S
            while metrics.ECHOES_SKIPPED._value.get() == echoes and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert metrics.ECHOES_SKIPPED._value.get() == echoes + 1
            assert not queue._pending  # the echo woke nothing
            peer.put(ref, {"app": "y"})  # someone else's change
            while not queue._pending and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert queue._pending == {("ns-a", "m1"): False}
        finally:
            await watches.stop()
            await stop_triggers(events)

    asyncio.run(run())
