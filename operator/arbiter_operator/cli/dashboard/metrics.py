"""The numbers a model's page shows from Prometheus: per version the decision mix, fallbacks by reason, p50/p99 and
decisions/s over the window, and the operator's traffic-weight series (what the split was before the dashboard
started). One function of a Prometheus client; the PromQL follows the promotion analysis' labels (queries.py)."""

from __future__ import annotations

from typing import Any

from ..promclient import Prometheus
from ..queries import model_selector
from .store import Key, ModelMetrics

VERSION = "arbiter_dev_version"


def _w(window_s: float) -> str:
    return f"{max(60, int(window_s))}s"


def _shares(rows: list[tuple[dict[str, str], float]], key: str) -> dict[str, dict[str, float]]:
    totals: dict[str, float] = {}
    for labels, value in rows:
        totals[labels.get(VERSION, "")] = totals.get(labels.get(VERSION, ""), 0.0) + value
    out: dict[str, dict[str, float]] = {}
    for labels, value in rows:
        version = labels.get(VERSION, "")
        if totals.get(version):
            out.setdefault(version, {})[labels.get(key, "")] = value / totals[version]
    return out


def model_metrics(p: Prometheus, key: Key, obj: dict[str, Any] | None, window_s: float, now: float) -> ModelMetrics:
    sel, w = model_selector(*key), _w(window_s)
    m = ModelMetrics(at=now)
    m.mix = _shares(p.vector(f"sum by ({VERSION}, label) (increase(arbiter_decision_labels_total{{{sel}}}[{w}]))"),
                    "label")
    decisions = {labels.get(VERSION, ""): v for labels, v in
                 p.vector(f"sum by ({VERSION}) (increase(arbiter_decisions_total{{{sel}}}[{w}]))")}
    for labels, value in p.vector(f"sum by ({VERSION}, reason) (increase(arbiter_fallbacks_total{{{sel}}}[{w}]))"):
        version = labels.get(VERSION, "")
        if decisions.get(version):
            # Two increase()s extrapolate from their own first and last samples, so an all-fallback version can read
            # a hair over its decisions: a share of decisions is at most all of them.
            m.fallbacks.setdefault(version, {})[labels.get("reason", "")] = min(1.0, value / decisions[version])
    m.rate = {labels.get(VERSION, ""): v for labels, v in
              p.vector(f"sum by ({VERSION}) (rate(arbiter_decisions_total{{{sel}}}[{w}]))")}
    buckets = f"sum by ({VERSION}, le) (rate(arbiter_decision_latency_seconds_bucket{{{sel}}}[{w}]))"
    p50 = {labels.get(VERSION, ""): v for labels, v in p.vector(f"histogram_quantile(0.5, {buckets})")}
    p99 = {labels.get(VERSION, ""): v for labels, v in p.vector(f"histogram_quantile(0.99, {buckets})")}
    m.latency = {v: (p50.get(v), p99.get(v)) for v in set(p50) | set(p99)}
    ns, name = (k.replace("\\", "\\\\").replace('"', '\\"') for k in key)
    state = f'decisionmodel_namespace="{ns}",decisionmodel="{name}"'
    series = p.matrix(f"arbiter_decisionmodel_traffic_weight{{{state}}}", now - 3600, now, 30)
    m.weights = [(labels.get("version", ""), points) for labels, points in series]
    return m
