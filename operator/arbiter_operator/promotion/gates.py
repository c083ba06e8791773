"""The gates of a Windowed analysis, one row each of `GATES`, and the rows the Sequential mode judges the same way
(vLLM's bounds and the user's checks: numbers, not counts) (pure).

Each gate is a `CheckResult` in status, with its value and bound:
- p95LatencyMs, errorRate: the candidate's decision latency and share of failed decisions;
- fallbackRate (and fallbackRate/<reason> where a per-reason bound is set), lowConfidenceRate: shares of decisions;
- schemaViolationRate: rejected model answers (schema violations and inconsistent trajectories) per decision;
- decisionMixShift: the largest absolute difference, over labels, between the share of decisions the candidate and the
  stable version gave that label in the same window (see docs/operations.md);
- queueTimeP95Ms, kvCacheUsage: vLLM's p95 queue time and peak KV-cache use, only when a bound is set;
- agreement (shadow phase): the share of mirrored requests where both versions chose the same label;
- the user's custom checks (spec.promote.analysis.checks), judged by the same loop.

A gate that cannot judge never passes: no numbers is NoData; too few decisions on either version, or a difference
above the bound that chance alone explains, is Pending (the step holds until the evidence suffices).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from arbiter_operator.api.promotion import CheckResult, MetricCheck
from arbiter_operator.promotion.promql import LOW_CONFIDENCE_REASON
from arbiter_operator.promotion.values import as_number, count, counts, ms, pct

if TYPE_CHECKING:
    from arbiter_operator.promotion.analysis import AnalysisQuery


# A mix shift fails only when it is also this many standard errors of the share difference: with a few hundred
# decisions per window, label shares of two identical versions differ by several points by chance alone.
MIX_SIGNIFICANCE = 3.0


def mix_shift(candidate: Mapping[str, float], stable: Mapping[str, float]) -> tuple[float, str, float] | None:
    """(largest absolute label-share difference, the label it is on, that difference's noise: MIX_SIGNIFICANCE
    standard errors); None when either side has no decisions."""
    ct, stt = sum(candidate.values()), sum(stable.values())
    if ct <= 0 or stt <= 0:
        return None
    best, where, noise = -1.0, "", 0.0
    for label in sorted(set(candidate) | set(stable)):
        c, s = candidate.get(label, 0.0), stable.get(label, 0.0)
        d = abs(c / ct - s / stt)
        if d > best:
            pooled = (c + s) / (ct + stt)
            se = math.sqrt(max(0.0, pooled * (1 - pooled)) * (1 / ct + 1 / stt))
            best, where, noise = d, label, MIX_SIGNIFICANCE * se
    return best, where, noise


def check(name: str, value: float | None, bound: float | None, direction: str = "max", what: str = "",
          fmt: Any = pct) -> CheckResult:
    """A number against its bound."""
    if value is None or bound is None:
        verdict = "NoData" if bound is not None else "Pass"
        return CheckResult(name=name, value=value, bound=bound, direction=direction, verdict=verdict,
                           message=f"{what or name}: no data" if value is None else f"{what or name} {fmt(value)}")
    bad = value > bound if direction == "max" else value < bound
    if bad:
        word = "above max" if direction == "max" else "below min"
    else:
        word = "within max" if direction == "max" else "at or above min"
    return CheckResult(name=name, value=value, bound=bound, direction=direction,
                       verdict="Fail" if bad else "Pass", message=f"{what or name} {fmt(value)} {word} {fmt(bound)}")


def compared(values: Mapping[str, Any]) -> float:
    """Mirrored requests both versions answered (the shadow phase's sample)."""
    agree = counts(values.get("shadow_agree"))
    return agree.get("true", 0.0) + agree.get("false", 0.0)


def share(values: Mapping[str, Any], requests: float | None, name: str) -> float | None:
    # A missing series only means nothing of the kind happened yet, as long as decisions were counted.
    if requests is None or requests <= 0:
        return None
    return count(values, name) / requests


@dataclass(frozen=True)
class Numbers:
    """What the gates read: one analysis's answers (any shape; read only through `num` and `counts`, which turn
    anything but a finite number into no data) and the request count, known to be at least minRequests."""

    query: AnalysisQuery
    values: Mapping[str, Any]
    requests: float
    p95_ms: float | None  # the gating p95 (see analysis._p95_ms)

    def num(self, name: str) -> float | None:
        return as_number(self.values.get(name))

    def counts(self, name: str) -> dict[str, float]:
        return counts(self.values.get(name))

    def share(self, name: str) -> float | None:
        return share(self.values, self.requests, name)

    def compared(self) -> float:
        return compared(self.values)

    def mix(self) -> tuple[float, str, float] | None:
        return mix_shift(self.counts("labels"), self.counts("stable_labels"))


def _always(query: AnalysisQuery) -> bool:
    return True


@dataclass(frozen=True)
class Gate:
    """One gate, judged into one CheckResult by `check`: a built-in row of GATES or one of the user's checks.

    Its bound was resolved when the query was built (`analysis_due`, by promotion.bounds: spec.promote.analysis,
    else the version's metadata.sla, else the default), because the observe layer runs the PromQL in between and
    `judge` never sees the spec: `bound` reads the resolved one off the query."""

    name: str
    what: str  # how messages name it
    value: Callable[[Numbers], float | None]  # the observed value, None for no data
    bound: Callable[[AnalysisQuery], float | None]
    direction: Literal["max", "min"] = "max"
    applies: Callable[[AnalysisQuery], bool] = _always
    optional: bool = False  # off (not listed at all) unless its bound is set
    fmt: Callable[[float], str] = pct  # how its value and bound are written in messages
    reading: Callable[[CheckResult, Numbers], CheckResult] | None = None  # what this gate adds to the plain verdict
    counted: bool = True  # judged from counts (the Sequential mode tests it); False: a number against its bound

    def check(self, numbers: Numbers) -> CheckResult:
        c = check(self.name, self.value(numbers), self.bound(numbers.query), self.direction, self.what, self.fmt)
        return c if self.reading is None else self.reading(c, numbers)


def _low_confidence_rate(n: Numbers) -> float | None:
    # Flagged decisions and those handed to the rules for low confidence: the model was unsure of both.
    flagged = max(0.0, n.num("low_confidence") or 0.0)
    if n.requests <= 0:
        return None  # no decisions (minRequests may be 0): no data, never a division by zero
    return (flagged + n.counts("fallback_reasons").get(LOW_CONFIDENCE_REASON, 0.0)) / n.requests


def _fallback_reason_gates(query: AnalysisQuery) -> list[Gate]:
    """fallbackRate/<reason>, for every reason with a bound of its own (spec.promote.analysis only)."""
    def gate(reason: str, bound: float) -> Gate:
        return Gate(
            f"fallbackRate/{reason}", f"fallback rate ({reason})",
            lambda n: n.counts("fallback_reasons").get(reason, 0.0) / n.requests if n.requests else None,
            lambda q: bound,
        )

    return [gate(reason, bound) for reason, bound in sorted(query.bounds.max_fallback_by_reason.items())]


def _custom_gates(query: AnalysisQuery) -> list[Gate]:
    """spec.promote.analysis.checks: the number of each one's PromQL against its own bound and direction."""
    def gate(c: MetricCheck) -> Gate:
        return Gate(c.name, c.name, lambda n: n.num(f"check:{c.name}"), lambda q: c.bound, c.direction,
                    fmt=lambda v: f"{v:.4g}", counted=False)

    return [gate(c) for c in query.checks]


def _mix_reading(c: CheckResult, n: Numbers) -> CheckResult:
    """The label the shift is on; a gate that cannot tell yet (too few decisions from either version, or a shift
    above the bound that chance alone explains for this many decisions) holds the step: Pending, never a pass."""
    cand, stable = n.counts("labels"), n.counts("stable_labels")
    need = max(1, n.query.min_requests)
    if not cand and not stable:
        return CheckResult(name=c.name, bound=c.bound, verdict="NoData",
                           message="decision mix shift: no data (no decision mix from either version)")
    for who, mix in (("the stable version", stable), ("the candidate", cand)):
        seen = sum(mix.values())
        if seen < need:
            return CheckResult(name=c.name, bound=c.bound, verdict="Pending",
                               message=f"decision mix shift: waits for {who}: {seen:.0f} decisions in the window, "
                               f"fewer than {need}")
    shift, label, noise = n.mix() or (0.0, "", 0.0)
    detail = f"label {label!r}"
    if c.verdict == "Fail" and shift <= noise:
        c = c.model_copy(update={"verdict": "Pending", "message": f"decision mix shift {pct(shift)} above max "
                                 f"{pct(c.bound)} but within noise (waits for more decisions)"})
        detail += f", {MIX_SIGNIFICANCE:g} standard errors {pct(noise)}"
    return c.model_copy(update={"message": f"{c.message} ({detail})"})


def _shift(n: Numbers) -> float | None:
    mix = n.mix()
    return None if mix is None else mix[0]


def _agreement_reading(c: CheckResult, n: Numbers) -> CheckResult:
    """The most frequent disagreements, so a failed shadow phase says what the candidate decides differently."""
    confusion = sorted(n.counts("shadow_confusion").items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    if not confusion:
        return c
    return c.model_copy(update={"message": c.message + " (top disagreements stable->candidate: "
                                + ", ".join(f"{k} {v:.0f}" for k, v in confusion) + ")"})


def _queue_p95_ms(n: Numbers) -> float | None:
    q = n.num("queue_p95")
    return None if q is None else q * 1000.0


# The gates in the order status lists them; a function row stands for the gates it makes from the query.
GATES: tuple[Gate | Callable[[AnalysisQuery], list[Gate]], ...] = (
    Gate("p95LatencyMs", "p95 latency", lambda n: n.p95_ms, lambda q: q.p95_bound_ms, fmt=ms),
    Gate("errorRate", "error rate", lambda n: n.share("errors"), lambda q: q.max_error_rate),
    Gate("fallbackRate", "fallback rate", lambda n: n.share("fallbacks"), lambda q: q.bounds.max_fallback_rate),
    _fallback_reason_gates,
    Gate("lowConfidenceRate", "low-confidence rate", _low_confidence_rate, lambda q: q.bounds.max_low_confidence_rate),
    Gate("schemaViolationRate", "schema violation rate", lambda n: n.share("schema_violations"),
         lambda q: q.bounds.max_schema_violation_rate),
    Gate("decisionMixShift", "decision mix shift", _shift, lambda q: q.bounds.max_mix_shift,
         applies=lambda q: q.stable is not None, reading=_mix_reading),
    Gate("queueTimeP95Ms", "vLLM queue time p95", _queue_p95_ms, lambda q: q.bounds.max_queue_p95_ms, optional=True,
         fmt=ms, counted=False),
    Gate("kvCacheUsage", "vLLM KV-cache use", lambda n: n.num("kv_cache"), lambda q: q.bounds.max_kv_cache,
         optional=True, counted=False),
    Gate("agreement", "shadow agreement", lambda n: n.counts("shadow_agree").get("true", 0.0) / n.compared(),
         lambda q: q.bounds.min_agreement, "min", applies=lambda q: q.shadow, optional=True,
         reading=_agreement_reading),
    _custom_gates,
)


def gates(query: AnalysisQuery) -> list[Gate]:
    """The gates this analysis judges, in status order."""
    rows = [g for row in GATES for g in ([row] if isinstance(row, Gate) else row(query))]
    return [g for g in rows if g.applies(query) and not (g.optional and g.bound(query) is None)]
