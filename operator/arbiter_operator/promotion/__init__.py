"""Promotion: hot version switching with canary analysis and automatic rollback.

The planner calls `advance(PromotionInputs) -> PromotionPlan` once per reconcile; before it, the observe layer asks
`analysis_due(...)` whether an analysis must run and, if so, runs it (observe.analysis) and `judge`s the numbers.
Pure: no I/O, no clock (`now` is passed in).
"""

from arbiter_operator.api.conditions import Event as PromotionEvent
from arbiter_operator.promotion.analysis import AnalysisQuery, analysis_due, judge
from arbiter_operator.promotion.history import HISTORY_LIMIT
from arbiter_operator.promotion.machine import advance
from arbiter_operator.promotion.model import PromotionInputs, PromotionPlan, ReadyVerdict, VersionObservation
from arbiter_operator.promotion.promql import DEFAULT_LABELS, MetricLabels, build_queries
from arbiter_operator.promotion.schedule import next_analysis_at

__all__ = [
    "DEFAULT_LABELS",
    "HISTORY_LIMIT",
    "AnalysisQuery",
    "MetricLabels",
    "PromotionEvent",
    "PromotionInputs",
    "PromotionPlan",
    "ReadyVerdict",
    "VersionObservation",
    "advance",
    "analysis_due",
    "build_queries",
    "judge",
    "next_analysis_at",
]
