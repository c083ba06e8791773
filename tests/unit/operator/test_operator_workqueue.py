"""The operator's work queue (no cluster): deduplication, no double processing, earliest requeue wins, urgent
wake-ups first."""

from __future__ import annotations

import asyncio

from arbiter_operator.kube.workqueue import PriorityWorkQueue as WorkQueue
from hypothesis import given, settings
from hypothesis import strategies as st


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
    assert not q._pending


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
    assert not q._pending, "the converged key woke up on a stale timer"


async def test_a_version_made_ready_is_reconciled_before_a_fleets_first_passes():
    q = WorkQueue()
    for i in range(50):  # a fleet created at once: first passes, in order
        q.add(("ns", f"new-{i}"))
    q.add(("ns", "loaded"), urgent=True)  # KServe says an earlier one's version is ready
    assert await q.get() == ("ns", "loaded")
    assert await q.get() == ("ns", "new-0")


async def test_a_waiting_key_made_urgent_moves_ahead_and_runs_once():
    q = WorkQueue()
    q.add(("ns", "a"))
    q.add(("ns", "b"))
    q.add(("ns", "b"), urgent=True)
    q.add(("ns", "b"))  # an ordinary wake-up does not move it back
    got = [await q.get() for _ in range(2)]
    assert got == [("ns", "b"), ("ns", "a")]
    assert not q._pending
    for key in got:
        q.done(key)
    await asyncio.sleep(0)
    assert not q._pending, "a key made urgent ran twice"


async def test_an_urgent_wake_up_during_a_pass_runs_next_in_the_urgent_lane():
    q = WorkQueue()
    q.add(("ns", "a"))
    running = await q.get()
    q.add(("ns", "b"))
    q.add(running, urgent=True)  # KServe's verdict moved while the pass ran
    q.done(running)
    assert await q.get() == running
    assert await q.get() == ("ns", "b")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "get", "done"]), st.integers(0, 4), st.booleans()), max_size=60))
def test_any_sequence_runs_every_key_once_per_wake_up_urgent_first(ops):
    """Against a model: a key is never handed out while it runs, every wake-up is served, urgent keys come before
    ordinary ones."""

    async def run() -> None:
        q = WorkQueue()
        waiting: dict[int, bool] = {}  # model: key -> urgent
        active: set[int] = set()
        dirty: dict[int, bool] = {}
        for op, k, urgent in ops:
            if op == "add":
                q.add(("ns", str(k)), urgent)
                if k in active:
                    dirty[k] = dirty.get(k, False) or urgent
                else:
                    waiting[k] = waiting.get(k, False) or urgent
            elif op == "get" and waiting:
                key = await asyncio.wait_for(q.get(), 1)
                got = int(key[1])
                assert got in waiting and got not in active
                if any(waiting.values()):
                    assert waiting[got], "an ordinary key was served before an urgent one"
                del waiting[got]
                active.add(got)
            elif op == "done" and k in active:
                q.done(("ns", str(k)))
                active.discard(k)
                if k in dirty:
                    waiting[k] = waiting.get(k, False) or dirty.pop(k)
        assert set(q._pending) == {("ns", str(k)) for k in waiting}  # exactly the model's waiting keys
        while waiting:  # everything still waiting is served, each key once
            got = int((await asyncio.wait_for(q.get(), 1))[1])
            assert got in waiting
            del waiting[got]
        assert not q._pending

    asyncio.run(run())
