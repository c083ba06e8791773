"""The operator's own Prometheus metrics (served by __main__ on --metrics-port; docs/operations.md lists them).

Module-level collectors on prometheus_client's default registry, next to its process and Python collectors. Every
name starts with `arbiter_operator_`; label values come from small fixed sets (never a namespace or a model name:
the fleet can be thousands of DecisionModels, and a label per model would make the series count grow with it).
"""

from __future__ import annotations

import platform
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Info

# Reconcile passes end in one of these results.
CONVERGED = "converged"  # nothing more to do until something changes
REQUEUED = "requeued"  # the plan asked to look again later (a version loading, a promotion step, a recheck)
ERROR = "error"  # the pass raised; retried with back-off

RECONCILES = Counter(
    "arbiter_operator_reconcile_total",
    "Reconcile passes of DecisionModels, by result (converged, requeued, error).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "arbiter_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass of one DecisionModel, by result.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECONCILE_ERRORS = Counter(
    "arbiter_operator_reconcile_errors_total",
    "Reconcile passes that failed, by the kind of failure (kube: the apiserver answered an error; other).",
    ["kind"],
)
for _kind in ("kube", "other"):  # an error rate exists (as 0) before the first failure
    RECONCILE_ERRORS.labels(_kind)
QUEUE_DEPTH = Gauge(
    "arbiter_operator_workqueue_depth",
    "DecisionModels waiting in the work queue for a worker (not counting those being reconciled or delayed).",
)
QUEUE_WAIT_SECONDS = Histogram(
    "arbiter_operator_workqueue_wait_seconds",
    "Time a DecisionModel waited in the work queue between becoming due and a worker picking it up.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0),
)
KUBE_REQUESTS = Counter(
    "arbiter_operator_kube_requests_total",
    "Requests the operator's reconcile made to the Kubernetes API, by HTTP verb and response code class "
    "(2xx, 4xx, 5xx; 'error' when no answer came).",
    ["verb", "code"],
)
PROMOTIONS = Counter(
    "arbiter_operator_promotions_total",
    "Promotions that finished, by outcome as recorded in status.promotion.history.",
    ["outcome"],
)

OBJECTS_REFUSED = Counter(
    "arbiter_operator_objects_refused_total",
    "Objects the operator could not take in, by kind and reason (Undecodable: nested deeper than its decoders go, held "
    "as a stand-in; InvalidSpec: a DecisionModel its API refuses; StatusRefused: not even its status could be "
    "written, an Event says why).",
    ["kind", "reason"],
)

for _reason in ("Undecodable", "InvalidSpec", "StatusRefused"):  # an increase over a window exists from the first
    OBJECTS_REFUSED.labels("DecisionModel", _reason)  # refusal on (a series that starts at 1 has none)

ECHOES_SKIPPED = Counter(
    "arbiter_operator_watch_echoes_skipped_total",
    "Watch events that carried exactly what the operator's own last write produced, so queued no reconcile.",
)

WATCH_EVENTS = Counter(
    "arbiter_operator_watch_events_total",
    "Events received on the operator's watches of its children's kinds (ADDED, MODIFIED, DELETED; not bookmarks), by "
    "kind.",
    ["kind"],
)
WATCH_BYTES = Counter(
    "arbiter_operator_watch_bytes_total",
    "Bytes of watch events received on the operator's watches of its children's kinds, by kind.",
    ["kind"],
)

LEADER = Gauge(
    "arbiter_operator_leader",
    "1 while this replica leads (holds the leader Lease, or runs without leader election), else 0 (standby).",
)

RELEASE = "0.1.0"  # the product release: pyproject.toml's version (a test keeps them equal)
BUILD = Info("arbiter_build", "The operator's release and Python version (value 1).")
BUILD.info({"version": RELEASE, "python_version": platform.python_version()})


def code_class(status: int | None) -> str:
    return "error" if status is None else f"{status // 100}xx"


_KUBE_REQUEST_SERIES: dict[tuple[str, str], Counter] = {}


def count_request(method: str, status: int | None) -> None:
    """One request to the apiserver in KUBE_REQUESTS. Its few series are kept here once made: `labels()` checks and
    locks on every call, and every request of the operator counts."""
    key = (method, code_class(status))
    series = _KUBE_REQUEST_SERIES.get(key)
    if series is None:
        series = _KUBE_REQUEST_SERIES[key] = KUBE_REQUESTS.labels(*key)
    series.inc()


def new_promotion_outcomes(old_status: dict[str, Any] | None, new_status: dict[str, Any] | None) -> list[str]:
    """Outcomes of promotion records in `new_status` that `old_status` did not have (records are identified by
    version, start and finish time; the history is capped, so a record that falls off the front is not new)."""

    def records(status: dict[str, Any] | None) -> list[dict[str, Any]]:
        hist = ((status or {}).get("promotion") or {}).get("history") or []
        return [r for r in hist if isinstance(r, dict)]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("version"), r.get("startedAt"), r.get("finishedAt"))

    seen = {key(r) for r in records(old_status)}
    return [str(r.get("outcome") or "Unknown") for r in records(new_status) if key(r) not in seen]
