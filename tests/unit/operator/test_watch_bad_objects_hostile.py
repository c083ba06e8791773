"""One bad object never stops the others: a hostile apiserver (support/hostile_apiserver.py, a real HTTP server on
loopback) serves DecisionModels and InferenceServices of which any may be nested deeper than the operator's decoders go,
huge or of the wrong shape, in list pages and watch streams, with cut and garbage lines around them (kube/watch.py,
triggers.Triggers, the work queue and its workers).

What a user would notice: every object reaches the cache at its resourceVersion (one that cannot be decoded as a
stand-in naming why, every other one whole), every DecisionModel gets its pass (where a bad one is refused on its
status), and no watch ended or raised.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from arbiter_operator import app
from arbiter_operator.api.kubejson import REFUSED
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.watch import WatchOptions
from arbiter_operator.render.common import LABEL_DM
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from support.hostile_apiserver import TRANSPORT, HostileApiserver, module_peer
from support.watch_rig import FAST_BACKOFF, new_triggers, served, stop_triggers

KINDS = served("decisionmodels", "inferenceservices")
RESOURCES = [r for r in app.WATCHED if r.plural in KINDS]
LABELS = {"decisionmodels": {}, "inferenceservices": {LABEL_DM: "dm"}}
MAX_BYTES = 2 * 1024 * 1024
OPTIONS = WatchOptions(timeout_seconds=1, connect_timeout=1.0, read_timeout=1.3, list_timeout=4.0, page_size=3,
                       max_page_bytes=4 * MAX_BYTES, max_event_bytes=MAX_BYTES, healthy_after=0.3, relist_after=2,
                       backoff=FAST_BACKOFF)
CONVERGE_S = 30.0
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


def deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


# (spec bytes, whether the operator can decode it): the apiserver admits JSON nested up to 10,000 levels, orjson reads
# 1,024 and msgspec fewer (Python's recursion limit).
BAD_SPECS: dict[str, tuple[bytes, bool]] = {
    "deep-600": (deep(600), True), "deep-1100": (deep(1100), False), "deep-3000": (deep(3000), False),
    "arrays-100000": (b"[" * 100_000 + b"]" * 100_000, False),
    "huge": (json.dumps({"blob": "x" * 1_000_000, "n": list(range(20_000))}).encode(), True),
    "wrong-shape": (b'"many"', True), "null": (b"null", True), "list": (b"[1, {}, []]", True),
}
REFS = [(plural, ns, name) for plural in sorted(KINDS) for ns in ("ns-a", "ns-b") for name in ("m1", "m2", "m3")]


def stray_line(spec: bytes, cut: bool) -> bytes:
    """A watch line for an object the peer does not hold (a lie the relist undoes), maybe cut in the middle."""
    line = (b'{"type":"ADDED","object":{"apiVersion":"arbiter.dev/v1alpha1","kind":"DecisionModel","metadata":'
            b'{"name":"stray","namespace":"ns-a","resourceVersion":"99999999"},"spec":' + spec + b"}}")
    return line[: len(line) // 2] if cut else line


behaviour_st = st.one_of(
    st.sampled_from(TRANSPORT).map(lambda t: (t,)),
    st.tuples(st.just("events"), st.lists(st.builds(stray_line, st.sampled_from([s for s, _ in BAD_SPECS.values()]),
                                                    st.booleans()), max_size=3), st.sampled_from(["end", "honest"])),
    st.just(("honest",)),
)
objects_st = st.dictionaries(st.sampled_from(REFS), st.one_of(st.none(), st.sampled_from(sorted(BAD_SPECS))),
                             min_size=1, max_size=8)


peer = module_peer(hang_s=1.5, kinds=KINDS)


def held(cache: WatchCache) -> dict[tuple[str, str, str], tuple[str, bool]]:
    out = {}
    for r in RESOURCES:
        for obj in cache.list(r.api_version, r.kind, None, []):
            meta = obj["metadata"]
            out[(r.kind, meta["namespace"], meta["name"])] = (meta.get("resourceVersion"), REFUSED in obj)
    return out


def expected(peer: HostileApiserver, objects: dict[Any, str | None]) -> dict[tuple[str, str, str], tuple[str, bool]]:
    rvs = peer.objects()
    return {(KINDS[p][1], ns, name): (rvs[(KINDS[p][1], ns, name)], bad is not None and not BAD_SPECS[bad][1])
            for (p, ns, name), bad in objects.items()}


class Passes:
    """The pass: records each DecisionModel it was given."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, str]] = set()

    async def reconcile(self, namespace: str, name: str) -> None:
        self.keys.add((namespace, name))


@SETTINGS
@example(objects={("decisionmodels", "ns-a", "m1"): "deep-3000", ("decisionmodels", "ns-b", "m1"): None,
                  ("decisionmodels", "ns-a", "m2"): "deep-1100", ("decisionmodels", "ns-a", "m3"): "deep-600",
                  ("inferenceservices", "ns-a", "m1"): "arrays-100000"}, script=[("honest",)], scoped=False)
@given(objects=objects_st, script=st.lists(behaviour_st, min_size=1, max_size=5), scoped=st.booleans())
def test_every_object_converges_whatever_one_of_them_holds(peer, objects, script, scoped):
    scopes = ["ns-a", "ns-b"] if scoped else []
    errors: list[Any] = []

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        events = new_triggers(peer)
        cache, queue = events.cache, events.queue
        for ref in REFS:
            peer.set_spec(ref, BAD_SPECS[objects[ref]][0] if objects.get(ref) else None)
        peer.go_honest({ref: LABELS[ref[0]] for ref in objects})
        peer.set_script(script, cycle=False)
        watches = app.watches_for(events, peer.configuration(), RESOURCES, scopes, OPTIONS).start()
        passes, leading = Passes(), asyncio.Event()
        leading.set()
        worker = asyncio.create_task(app.worker(queue, passes, {}, leading, 0, watches.primed))  # type: ignore[arg-type]
        want_passes = {(ns, name) for (p, ns, name) in objects if p == "decisionmodels"}
        try:
            deadline = time.monotonic() + CONVERGE_S
            while time.monotonic() < deadline and not (
                    held(cache) == expected(peer, objects) and passes.keys >= want_passes):
                await asyncio.sleep(0.05)
            assert held(cache) == expected(peer, objects)
            assert passes.keys >= want_passes  # every DecisionModel got its pass, the bad ones too (to refuse them)
            assert watches.running and all(not t.done() for t in watches._tasks.values())
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await watches.stop()
            await stop_triggers(events)
            peer.set_script([])

    asyncio.run(run())
    assert not errors  # no exception escaped a task
