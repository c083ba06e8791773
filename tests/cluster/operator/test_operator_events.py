"""Events are aggregated on the real apiserver: a reason repeated on one DecisionModel joins one Event whose count
grows (like client-go's event correlator), written at most once a minute; an expired Event starts a new series."""

from __future__ import annotations

import asyncio
import uuid

from arbiter_operator.kube import events as kube
from arbiter_operator.kube.client import RestKubeClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _involved(namespace: str, name: str) -> dict:
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "DecisionModel",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "1"}}


def _events(api, namespace: str, name: str) -> list:
    out = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return sorted(out.items, key=lambda e: e.metadata.creation_timestamp)


async def test_a_repeated_reason_is_one_counted_event(control_plane, namespace, api):
    kc, clock = RestKubeClient(api), Clock()
    kc.events.clock = clock
    dm = _involved(namespace, "credit-limit")
    for i in range(5):  # five analysis polls within a minute: one Event, the rest counted
        await kc.aevent(dm, "Warning", "InsufficientTraffic", f"Step 1/2 waits: {i} requests")
        clock.now += 5
    await kc.aevent(dm, "Normal", "Ready", "serving 1.0.0")  # another reason: its own Event
    (first, ready) = sorted(_events(api, namespace, "credit-limit"), key=lambda e: e.reason != "InsufficientTraffic")
    assert (first.reason, first.count, first.message) == ("InsufficientTraffic", 1, "Step 1/2 waits: 0 requests")
    assert (ready.reason, ready.count) == ("Ready", 1)

    clock.now += kube.SERIES_WRITE_INTERVAL  # a minute on, the next repeat writes the count so far
    await kc.aevent(dm, "Warning", "InsufficientTraffic", "Step 1/2 waits: 9 requests")
    (first,) = [e for e in _events(api, namespace, "credit-limit") if e.reason == "InsufficientTraffic"]
    assert (first.count, first.message) == (6, "Step 1/2 waits: 9 requests")

    # The Event expired (or someone deleted it): the next occurrence posts a new one.
    client.CoreV1Api(api).delete_namespaced_event(first.metadata.name, namespace)
    clock.now += kube.SERIES_WRITE_INTERVAL
    await kc.aevent(dm, "Warning", "InsufficientTraffic", "Step 1/2 waits: 12 requests")
    again = [e for e in _events(api, namespace, "credit-limit") if e.reason == "InsufficientTraffic"]
    assert [(e.count, e.message) for e in again] == [(1, "Step 1/2 waits: 12 requests")]

    # After the window, a repeat is news again: a new Event, the old one keeps its count.
    clock.now += kube.SERIES_WINDOW + 1
    await kc.aevent(dm, "Warning", "InsufficientTraffic", "Step 1/2 waits: 0 requests")
    again = [e for e in _events(api, namespace, "credit-limit") if e.reason == "InsufficientTraffic"]
    assert sorted(e.count for e in again) == [1, 1]
    await kc.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["A", "B"]), st.floats(min_value=0, max_value=200)), min_size=1,
                max_size=12))
def test_counts_never_exceed_occurrences_and_are_never_lost_to_writes(control_plane, namespace, api, occurrences):
    """Whatever the timing, every Event's count is what happened up to its last write: the sum of the counts
    written plus those still held in memory is the number of occurrences, reason by reason."""
    kc, clock = RestKubeClient(api), Clock()
    kc.events.clock = clock
    name = f"dm-{uuid.uuid4().hex[:8]}"
    dm = _involved(namespace, name)

    async def occur() -> None:
        for reason, gap in occurrences:
            clock.now += gap
            await kc.aevent(dm, "Normal", reason, f"{reason} happened")
        await kc.close()

    asyncio.run(occur())
    events = _events(api, namespace, name)
    for reason in ("A", "B"):
        happened = sum(1 for r, _ in occurrences if r == reason)
        written = sum(e.count for e in events if e.reason == reason)
        pending = sum(s.count - s.written_count for k, s in kc.events.series.items() if k[3] == reason)
        assert written + pending == happened
        assert (happened > 0) == any(e.reason == reason for e in events)
