"""The operator's work queue (no cluster): deduplication, no double processing, earliest requeue wins."""

from __future__ import annotations

import asyncio

from arbiter_operator.handlers import WorkQueue


async def test_duplicates_collapse_and_active_keys_rerun_once():
    q = WorkQueue()
    q.add(("ns", "a"))
    q.add(("ns", "a"))
    q.add(("ns", "b"))
    first = await q.get()
    assert first == ("ns", "a")
    q.add(("ns", "a"))  # changed while being reconciled: must run again, after this run
    q.add(("ns", "a"))
    assert await q.get() == ("ns", "b")
    q.done(("ns", "b"))
    q.done(first)
    assert await asyncio.wait_for(q.get(), 1) == ("ns", "a")
    q.done(("ns", "a"))
    assert q._queue.empty()


async def test_earliest_requeue_wins():
    q = WorkQueue()
    q.add_after(("ns", "a"), 30)
    q.add_after(("ns", "a"), 0.05)
    q.add_after(("ns", "a"), 60)  # later than the pending wake-up: ignored
    assert await asyncio.wait_for(q.get(), 2) == ("ns", "a")


async def test_a_finished_pass_replaces_the_wake_up_an_older_pass_asked_for():
    q = WorkQueue()
    q.add_after(("ns", "a"), 0.05)  # an older pass: "look again soon" (a version was loading)
    q.reschedule(("ns", "a"), None)  # the latest pass converged: nothing to look at
    q.add_after(("ns", "b"), 0.05)
    q.reschedule(("ns", "b"), 0.1)  # the latest pass asks for later than the stale wake-up
    assert await asyncio.wait_for(q.get(), 2) == ("ns", "b")
    q.done(("ns", "b"))
    await asyncio.sleep(0.2)
    assert q._queue.empty(), "the converged key woke up on a stale timer"
