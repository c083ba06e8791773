"""Event aggregation, like client-go's event correlator: the book of Event series the client keeps, and the bodies it
posts. The client (kube/client.py `RestKubeClient.aevent`) makes the requests.

A repeat of the same reason on the same object within SERIES_WINDOW joins the earlier Event (its count grows, its
message and lastTimestamp are the latest) instead of posting another, and a series is written at most once per
SERIES_WRITE_INTERVAL: repeats in between are counted in memory and go out with the next write. So a reason that
repeats on every analysis poll (a canary waiting for traffic) costs one write a minute at most, not one per poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..api.names import CORE_API, FIELD_MANAGER

log = logging.getLogger("arbiter.kube")

SERIES_WINDOW = 600.0
SERIES_WRITE_INTERVAL = 60.0
# Series kept before those nobody repeated within the window are forgotten.
MAX_SERIES = 10_000

SeriesKey = tuple[str, str, str, str]  # namespace, uid (or name), type, reason


@dataclass
class EventSeries:
    name: str  # the Event object's name
    count: int
    message: str
    seen: float  # monotonic time of the latest occurrence
    written: float  # monotonic time of the latest write (POST or PATCH)
    written_count: int


class Occurrence(NamedTuple):
    """One occurrence to send: `series` is the Event to update (None: post a new one)."""

    key: SeriesKey
    series: EventSeries | None
    message: str


class EventBook:
    """The series of the Events posted, by object and reason. Read and written only between a client's awaits (on one
    event loop), so it needs no lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.series: dict[SeriesKey, EventSeries] = {}

    def note(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> Occurrence | None:
        """Count one occurrence: None when it joins a series written moments ago (it goes out with the series' next
        write), else what to send."""
        meta = involved["metadata"]
        message = message[:1024]
        key = (meta["namespace"], meta.get("uid") or meta["name"], type_, reason)
        now = self.clock()
        if len(self.series) > MAX_SERIES:
            self.series = {k: v for k, v in self.series.items() if now - v.seen <= SERIES_WINDOW}
        series = self.series.get(key)
        if series is None or now - series.seen > SERIES_WINDOW:
            return Occurrence(key, None, message)
        series.count += 1
        series.message = message
        series.seen = now
        if now - series.written < SERIES_WRITE_INTERVAL:
            log.debug("event %s on %s counted (%d), written with the series' next write", reason, meta["name"],
                      series.count)
            return None
        return Occurrence(key, series, message)

    def written(self, series: EventSeries) -> None:
        series.written, series.written_count = self.clock(), series.count

    def posted(self, key: SeriesKey, out: dict[str, Any] | None, message: str) -> None:
        """A new Event was posted (`out`: the apiserver's answer, None when the post failed): its series starts."""
        name = ((out or {}).get("metadata") or {}).get("name")
        if name:
            now = self.clock()
            self.series[key] = EventSeries(name, 1, message, now, now, 1)


def series_patch(series: EventSeries, now: str) -> dict[str, Any]:
    """A series' count and latest message, as a merge patch of its Event."""
    return {"count": series.count, "message": series.message, "lastTimestamp": now}


def event_body(involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> dict[str, Any]:
    """A new core/v1 Event on `involved` (its first occurrence, at `now`), as the operator posts it."""
    meta = involved["metadata"]
    return {
        "apiVersion": CORE_API,
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
