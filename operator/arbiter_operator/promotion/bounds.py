"""The bounds an analysis judges against: each one from spec.promote.analysis, else the version's metadata.sla, else
a default (pure).

They are resolved once, when the analysis is due (`analysis.analysis_due`), and travel in its query: the observe
layer runs the PromQL in between, and `analysis.judge` reads them back without the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from arbiter_operator.api.promotion import (
    DEFAULT_MAX_DECISION_MIX_SHIFT,
    DEFAULT_MAX_FALLBACK_RATE,
    DEFAULT_MAX_LOW_CONFIDENCE_RATE,
    DEFAULT_MAX_SCHEMA_VIOLATION_RATE,
    EffectSizes,
    FallbackReasonBounds,
    PromoteSpec,
    Shadow,
)

# The shadow phase's settings when spec.promote.shadow is unset (strategy Shadow without it).
DEFAULT_SHADOW = Shadow()


@dataclass(frozen=True)
class VersionBounds:
    """Decision-quality bounds a version promises (its metadata.sla); None: not stated."""

    max_fallback_rate: float | None = None
    max_schema_violation_rate: float | None = None
    max_low_confidence_rate: float | None = None


@dataclass(frozen=True)
class DecisionBounds:
    """The resolved decision gates of one analysis (spec > version metadata > default)."""

    max_fallback_rate: float = DEFAULT_MAX_FALLBACK_RATE
    max_fallback_by_reason: Mapping[str, float] = field(default_factory=dict)
    max_schema_violation_rate: float = DEFAULT_MAX_SCHEMA_VIOLATION_RATE
    max_low_confidence_rate: float = DEFAULT_MAX_LOW_CONFIDENCE_RATE
    max_mix_shift: float = DEFAULT_MAX_DECISION_MIX_SHIFT
    max_queue_p95_ms: float | None = None
    max_kv_cache: float | None = None
    min_agreement: float | None = None  # set in the shadow phase only
    min_compared: int = 0


def resolve_bounds(spec: PromoteSpec, shadow: bool, version: VersionBounds | None = None) -> DecisionBounds:
    a, v = spec.analysis, version or VersionBounds()

    def pick(explicit: float | None, promised: float | None, default: float) -> float:
        return explicit if explicit is not None else (promised if promised is not None else default)

    sh = spec.shadow or DEFAULT_SHADOW
    return DecisionBounds(
        max_fallback_rate=pick(a.maxFallbackRate, v.max_fallback_rate, DEFAULT_MAX_FALLBACK_RATE),
        max_fallback_by_reason=(a.maxFallbackRateByReason or FallbackReasonBounds()).model_dump(exclude_none=True),
        max_schema_violation_rate=pick(
            a.maxSchemaViolationRate, v.max_schema_violation_rate, DEFAULT_MAX_SCHEMA_VIOLATION_RATE
        ),
        max_low_confidence_rate=pick(a.maxLowConfidenceRate, v.max_low_confidence_rate,
                                     DEFAULT_MAX_LOW_CONFIDENCE_RATE),
        max_mix_shift=a.maxDecisionMixShift if a.maxDecisionMixShift is not None else DEFAULT_MAX_DECISION_MIX_SHIFT,
        max_queue_p95_ms=a.maxQueueTimeP95Ms,
        max_kv_cache=a.maxKvCacheUsage,
        min_agreement=sh.minAgreement if shadow else None,
        min_compared=sh.minCompared if shadow else 0,
    )


def p95_bound_ms(spec: PromoteSpec, sla_p95_ms: float | None) -> float | None:
    """The p95 latency bound: spec.promote.analysis.p95LatencyMs, else the candidate's SLA; none without either."""
    return spec.analysis.p95LatencyMs if spec.analysis.p95LatencyMs is not None else sla_p95_ms


@dataclass(frozen=True)
class SequentialBounds:
    """Sequential mode's settings for one analysis: the promotion's false-rollback rate, the stages (canary steps and
    the shadow phase) that share it, each gate's tolerated regression, and what a pass needs."""

    false_rollback_rate: float
    stages: int
    effect: EffectSizes
    look_seconds: int

    def gate_alpha(self, gates: int) -> float:
        """One gate's share of the rate in one stage: a union bound over stages and gates, so the promotion as a
        whole rolls back a candidate that regresses no gate beyond its effect size with at most the declared rate."""
        return self.false_rollback_rate / (max(1, self.stages) * max(1, gates))


def sequential_bounds(spec: PromoteSpec) -> SequentialBounds | None:
    """The Sequential settings of spec.promote.analysis, or None in the Windowed mode."""
    a = spec.analysis
    if a.mode != "Sequential":
        return None
    seq = a.sequential_settings()
    shadow = spec.strategy == "Shadow" or (spec.strategy == "Canary" and spec.shadow is not None)
    steps = len(spec.steps) if spec.strategy == "Canary" else 0
    return SequentialBounds(seq.falseRollbackRate, steps + (1 if shadow else 0), seq.effectSizes, seq.lookSeconds)
