"""Per-DecisionModel state series, made at scrape time from the DecisionModels the watch cache holds.

What `kube-state-metrics` is for Deployments and Argo Rollouts' `rollout_info`/`rollout_phase` are for Rollouts: one
series per model for what its status says (phase, conditions, traffic split, last analysis, gates, promotion
outcomes, GPUs held), so SREs graph and alert per model (docs/operations.md, "Metrics"). Nothing is kept between
scrapes: every scrape reads status as it is, so a restart or a leader change loses nothing and a deleted model's
series are gone at the next scrape.

Cardinality is bounded by the fleet and its spec, never by traffic: per model one `info`, one `phase`, one series per
condition type, one weight per live version, one GPU count per version holding pods, one value and one bound per
gate of the last analysis (the spec caps checks at 64), one finish time per promotion outcome (three outcomes).
Only the leader exports them: a standby's cache holds the same models, and two replicas exporting would double every
fleet sum.

Labels are `decisionmodel_namespace` and `decisionmodel`, not `namespace`: OpenShift's user-workload monitoring sets
`namespace` on every series to the scrape target's namespace (the operator's), which would merge every model's
series of one name into one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .api.names import API_VERSION, KIND

MODEL_LABELS = ("decisionmodel_namespace", "decisionmodel")
IN_PROGRESS = ("Deploying", "Waiting", "Shadowing", "Progressing", "Paused", "RollingBack")
# Versions whose InferenceService asks for GPUs: it exists and is not stopped.
HOLDING_GPUS = ("Pending", "Deploying", "Ready", "Failed")


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


class _Families:
    """The families one scrape yields, filled model by model."""

    def __init__(self) -> None:
        m = MODEL_LABELS
        self.info = GaugeMetricFamily(
            "arbiter_decisionmodel_info", "1 per DecisionModel: its stable and candidate version and strategy.",
            labels=[*m, "stable", "candidate", "strategy"])
        self.phase = GaugeMetricFamily(
            "arbiter_decisionmodel_phase",
            "1 for the promotion phase the DecisionModel is in (status.promotion.phase).",
            labels=[*m, "phase"])
        self.condition = GaugeMetricFamily(
            "arbiter_decisionmodel_condition", "1 for the current status (True, False, Unknown) of each condition.",
            labels=[*m, "type", "status"])
        self.weight = GaugeMetricFamily(
            "arbiter_decisionmodel_traffic_weight", "Percent of the model's traffic each live version decides.",
            labels=[*m, "version"])
        self.step = GaugeMetricFamily(
            "arbiter_decisionmodel_promotion_step", "Index of the canary step the promotion is at (-1: none).",
            labels=list(m))
        self.started = GaugeMetricFamily(
            "arbiter_decisionmodel_promotion_started_timestamp_seconds",
            "When the running promotion started (present only while one runs).", labels=list(m))
        self.analysis = GaugeMetricFamily(
            "arbiter_decisionmodel_analysis", "1 for the verdict of the model's last promotion analysis.",
            labels=[*m, "verdict"])
        self.gate_value = GaugeMetricFamily(
            "arbiter_decisionmodel_gate_value", "What the last analysis measured for each gate (absent: no data).",
            labels=[*m, "gate"])
        self.gate_bound = GaugeMetricFamily(
            "arbiter_decisionmodel_gate_bound", "The bound each gate of the last analysis was judged against.",
            labels=[*m, "gate", "direction"])
        self.finished = GaugeMetricFamily(
            "arbiter_decisionmodel_promotion_last_finished_timestamp_seconds",
            "When the model's last promotion with each outcome (Succeeded, RolledBack, Aborted) finished.",
            labels=[*m, "outcome"])
        self.gpus = GaugeMetricFamily(
            "arbiter_decisionmodel_gpus", "GPUs the predictors of each version ask for (GPUs per pod x replicas); "
            "two versions hold GPUs while a promotion runs and during its rollback window.", labels=[*m, "version"])

    def all(self) -> list[GaugeMetricFamily]:
        return [self.info, self.phase, self.condition, self.weight, self.step, self.started, self.analysis,
                self.gate_value, self.gate_bound, self.finished, self.gpus]

    def add(self, dm: dict[str, Any]) -> None:
        meta = _dict(dm.get("metadata"))
        key = [str(meta.get("namespace") or ""), str(meta.get("name") or "")]
        spec, status = _dict(dm.get("spec")), _dict(dm.get("status"))
        promotion = _dict(status.get("promotion"))
        stable, candidate = str(promotion.get("stable") or ""), str(promotion.get("candidate") or "")
        strategy = str(_dict(spec.get("promote")).get("strategy") or "Canary")
        self.info.add_metric([*key, stable, candidate, strategy], 1)
        phase = str(promotion.get("phase") or "Idle")
        self.phase.add_metric([*key, phase], 1)
        for cond in _dicts(status.get("conditions")):
            if cond.get("type"):
                self.condition.add_metric([*key, str(cond["type"]), str(cond.get("status") or "Unknown")], 1)
        self._traffic(key, promotion, phase, stable, candidate)
        self._analysis(key, _dict(promotion.get("lastAnalysis")))
        self._history(key, _dicts(promotion.get("history")))
        self._gpus(key, _dict(spec.get("serving")), _dicts(status.get("versions")))

    def _traffic(self, key: list[str], promotion: dict[str, Any], phase: str, stable: str, candidate: str) -> None:
        weight = _number(promotion.get("weight")) or 0.0
        if stable:
            self.weight.add_metric([*key, stable], 100.0 - weight if candidate else 100.0)
        if candidate and candidate != stable:
            self.weight.add_metric([*key, candidate], weight)
        step = _number(promotion.get("step"))
        self.step.add_metric(key, step if step is not None else -1.0)
        started = _timestamp(promotion.get("startedAt"))
        if phase in IN_PROGRESS and started is not None:
            self.started.add_metric(key, started)

    def _analysis(self, key: list[str], last: dict[str, Any]) -> None:
        if not last:
            return
        self.analysis.add_metric([*key, str(last.get("verdict") or "Unknown")], 1)
        for check in _dicts(last.get("checks")):
            gate = str(check.get("name") or "")
            value, bound = _number(check.get("value")), _number(check.get("bound"))
            if gate and value is not None:
                self.gate_value.add_metric([*key, gate], value)
            if gate and bound is not None:
                self.gate_bound.add_metric([*key, gate, str(check.get("direction") or "max")], bound)

    def _history(self, key: list[str], history: list[dict[str, Any]]) -> None:
        latest: dict[str, float] = {}
        for record in history:
            outcome, finished = str(record.get("outcome") or ""), _timestamp(record.get("finishedAt"))
            if outcome and finished is not None and finished > latest.get(outcome, float("-inf")):
                latest[outcome] = finished
        for outcome, finished in sorted(latest.items()):
            self.finished.add_metric([*key, outcome], finished)

    def _gpus(self, key: list[str], serving: dict[str, Any], versions: list[dict[str, Any]]) -> None:
        per_version = (_number(serving.get("gpus")) or 1.0) * (_number(serving.get("replicas")) or 1.0)
        for version in versions:
            if version.get("inferenceService") and version.get("phase") in HOLDING_GPUS:
                self.gpus.add_metric([*key, str(version.get("name") or "")], per_version)


class DecisionModelStateCollector(Collector):
    """A prometheus_client collector over `list_models()` (the cache's DecisionModels), exporting while
    `leading()` is true."""

    def __init__(self, list_models: Callable[[], Iterable[dict[str, Any]]], leading: Callable[[], bool]) -> None:
        self.list_models, self.leading = list_models, leading

    def describe(self) -> list[GaugeMetricFamily]:
        # Nothing to declare up front: the registry then neither collects at registration (the cache is empty) nor
        # refuses a second Operator of a restarted shard registering before the first one's stop.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        started = time.perf_counter()
        families = _Families()
        if self.leading():
            for dm in self.list_models():
                families.add(dm)
        yield from families.all()
        yield GaugeMetricFamily(
            "arbiter_decisionmodel_state_scrape_seconds",
            "Time this scrape took to build the per-DecisionModel series (grows with the fleet).",
            value=time.perf_counter() - started)


def cache_lister(cache: Any) -> Callable[[], list[dict[str, Any]]]:
    """Every DecisionModel the watch cache holds, in every watched namespace."""
    return lambda: cache.list(API_VERSION, KIND, None, [])
