"""The work queue between the triggers (watch events, timers) and the reconcile workers."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from .. import metrics

Key = tuple[str, str]  # (namespace, name) of a DecisionModel


class PriorityWorkQueue:
    """A deduplicating work queue of keys with two priorities and delayed adds (client-go's delaying work queue, with
    a high-priority lane): a key waits at most once, and one key is never handed to two workers at once (a key added
    while it is worked on is handed out again when that work is done).

    The high priority, the `urgent` lane: a wake-up marked `urgent` (KServe's verdict on a version changed: it
    became ready, failed, or its pods got into trouble) is served before the ordinary ones (a DecisionModel created
    or edited, a child drifted). When a fleet is created at once, a thousand first passes queue up in minutes while
    KServe brings the versions up over many; in one line, a version KServe has just made ready would wait behind all
    of them for the pass that routes traffic to it. The urgent lane cannot starve the other: it fills at KServe's
    pace, a few per second.
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
