"""Promotion: hot version switching with canary analysis and automatic rollback.

The planner calls `advance(PromotionInputs) -> PromotionPlan` once per reconcile; before it, the observe layer asks
`analysis_due(...)` whether an analysis must run and, if so, runs it (observe.analysis) and `judge`s the numbers.
Pure: no I/O, no clock (`now` is passed in).
"""

from arbiter_operator.api.conditions import Event as PromotionEvent
from arbiter_operator.promotion.analysis import (
    DEFAULT_LABELS,
    AnalysisQuery,
    MetricLabels,
    analysis_due,
    build_queries,
    judge,
    next_analysis_at,
)
from arbiter_operator.promotion.machine import (
    HISTORY_LIMIT,
    PromotionInputs,
    PromotionPlan,
    ReadyVerdict,
    VersionObservation,
    advance,
)

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
