"""What the dashboard knows, fed by the watches and Prometheus, read by the page: each model's object as last seen,
its timeline (phase, traffic weights and Ready at each change since the dashboard started), its recent Events, the
Prometheus numbers of the models being looked at, and what could not be read. Thread-safe: the watch threads write,
the HTTP threads read; `changed` wakes the pages' live-update streams."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..shapes import cleaned

Key = tuple[str, str]  # (namespace, name)
MAX_POINTS = 500  # timeline points kept per model
MAX_EVENTS = 20  # Events kept per model


@dataclass(frozen=True)
class Point:
    """The promotion at one moment: phase, percent of traffic per version, Ready."""

    at: float
    phase: str
    weights: tuple[tuple[str, float], ...]
    ready: str


@dataclass
class ModelMetrics:
    """One model's numbers from Prometheus (per version), as of `at`."""

    at: float
    mix: dict[str, dict[str, float]] = field(default_factory=dict)  # version -> label -> share
    fallbacks: dict[str, dict[str, float]] = field(default_factory=dict)  # version -> reason -> share of decisions
    latency: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # version -> (p50, p99) s
    rate: dict[str, float] = field(default_factory=dict)  # version -> decisions/s
    weights: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)  # operator's series
    error: str | None = None


def point_of(obj: dict[str, Any], at: float) -> Point:
    status = obj.get("status") or {}
    promo = status.get("promotion") or {}
    stable, candidate, weight = promo.get("stable"), promo.get("candidate"), promo.get("weight") or 0
    weights: list[tuple[str, float]] = []
    if stable:
        weights.append((str(stable), float(100 - weight) if candidate and candidate != stable else 100.0))
    if candidate and candidate != stable:
        weights.append((str(candidate), float(weight)))
    ready = next((str(c.get("status")) for c in status.get("conditions") or []
                  if isinstance(c, dict) and c.get("type") == "Ready"), "Unknown")
    return Point(at, str(promo.get("phase") or "Idle"), tuple(weights), ready)


def event_key(event: dict[str, Any], models: set[Key]) -> Key | None:
    """The model an Event is about: the DecisionModel itself or one of its children (`<name>--<version>...`)."""
    obj = event.get("involvedObject") or {}
    ns, name = str(obj.get("namespace") or (event.get("metadata") or {}).get("namespace") or ""), str(obj.get("name")
                                                                                                     or "")
    if (ns, name) in models:
        return ns, name
    head = name.split("--", 1)[0]
    return (ns, head) if "--" in name and (ns, head) in models else None


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.version = 0  # bumped on every change the page shows
        self.started = time.time()
        self.models: dict[Key, dict[str, Any]] = {}
        self.timelines: dict[Key, list[Point]] = {}
        self.events: dict[Key, list[dict[str, Any]]] = {}
        self.metrics: dict[Key, ModelMetrics] = {}
        self.viewed: dict[Key, float] = {}  # when each model's page was last asked for
        self.problems: dict[str, str] = {}  # source -> what could not be read
        self.synced = False  # the first list of DecisionModels is in

    def _bump(self) -> None:
        self.version += 1
        self.changed.notify_all()

    def replace_all(self, objs: list[dict[str, Any]], at: float) -> None:
        with self._lock:
            seen = set()
            for obj in objs:
                seen.add(self._put(obj, at))
            for key in set(self.models) - seen:
                self._drop(key)
            self.synced = True
            self._bump()

    def put(self, obj: dict[str, Any], at: float) -> None:
        with self._lock:
            self._put(obj, at)
            self._bump()

    def delete(self, key: Key) -> None:
        with self._lock:
            self._drop(key)
            self._bump()

    def _put(self, raw: dict[str, Any], at: float) -> Key:
        obj = cleaned(raw)
        meta = obj["metadata"]
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self.models[key] = obj
        point = point_of(obj, at)
        line = self.timelines.setdefault(key, [])
        if not line or (line[-1].phase, line[-1].weights, line[-1].ready) != (point.phase, point.weights,
                                                                               point.ready):
            line.append(point)
            del line[:-MAX_POINTS]
        return key

    def _drop(self, key: Key) -> None:
        for table in (self.models, self.timelines, self.events, self.metrics):
            table.pop(key, None)

    def add_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            key = event_key(event, set(self.models))
            if key is None:
                return
            uid = (event.get("metadata") or {}).get("uid")
            kept = [e for e in self.events.get(key, []) if (e.get("metadata") or {}).get("uid") != uid]
            kept.append(event)
            self.events[key] = kept[-MAX_EVENTS:]
            self._bump()

    def set_metrics(self, key: Key, metrics: ModelMetrics) -> None:
        with self._lock:
            old = self.metrics.get(key)
            self.metrics[key] = metrics
            if old is None or dataclasses.replace(old, at=metrics.at) != metrics:
                self._bump()  # the page changes only when the numbers do

    def set_problem(self, source: str, problem: str | None) -> None:
        with self._lock:
            if self.problems.get(source) == problem or (problem is None and source not in self.problems):
                return
            if problem is None:
                self.problems.pop(source, None)
            else:
                self.problems[source] = problem
            self._bump()

    def mark_viewed(self, key: Key) -> None:
        with self._lock:
            self.viewed[key] = time.time()

    def snapshot(self, key: Key | None = None) -> dict[str, Any]:
        """A consistent copy of what one page needs (everything, or one model's)."""
        with self._lock:
            if key is None:
                return {"version": self.version, "models": dict(self.models), "problems": dict(self.problems),
                        "synced": self.synced, "timelines": {k: list(v) for k, v in self.timelines.items()}}
            return {"version": self.version, "model": self.models.get(key),
                    "timeline": list(self.timelines.get(key, [])), "events": list(self.events.get(key, [])),
                    "metrics": self.metrics.get(key), "problems": dict(self.problems), "started": self.started,
                    "synced": self.synced}

    def wait_change(self, seen: int, timeout: float) -> int:
        with self._lock:
            self.changed.wait_for(lambda: self.version != seen, timeout)
            return self.version
