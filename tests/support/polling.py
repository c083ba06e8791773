"""The one polling helper: wait for something a test cannot be told about (a server's state, a controller's write)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from arbiter_operator.kube.client import KubeError
from kubernetes.client.rest import ApiException

# What a half-written or not-yet-created object raises while a controller is still at work: retried, not failed.
API_RACES: tuple[type[BaseException], ...] = (AssertionError, KeyError, IndexError, TypeError, StopIteration,
                                              ApiException, KubeError)


def eventually(
    fn: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.25,
    ignoring: tuple[type[BaseException], ...] = (),
    check: Callable[[], Any] | None = None,
    context: Callable[[], str] | None = None,
) -> Any:
    """fn()'s first truthy result, trying at least once and once more at the deadline.

    `ignoring`: exceptions that count as "not yet" (others fail at once); `check`: called before every try, to fail
    fast (a server that died); `context`: appended to the timeout error (a log tail).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        if check is not None:
            check()
        try:
            last = fn()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            extra = f"\n{context()}" if context is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {str(last)[:2000]}{extra}")
        time.sleep(interval)


async def eventually_async(
    fn: Callable[[], Any], timeout: float = 60.0, what: str = "condition", *, interval: float = 0.05
) -> Any:
    """`eventually` for a coroutine test: fn()'s first truthy result, polled without blocking the event loop (the
    thing waited for usually runs on it)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {str(last)[:2000]}")
        await asyncio.sleep(interval)
