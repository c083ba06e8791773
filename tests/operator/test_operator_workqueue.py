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
