"""The Sequential mode's verdict: the counted gates judged on everything since the step began, each by an always-valid
test against the stable version (promotion.sequential), into status rows that carry their evidence (pure).

For each gate, the candidate's share and the stable version's (of the decisions since the step began), and the
interval of their difference at the gate's share of falseRollbackRate:
- Fail: the interval lies above the gate's tolerated regression (its effect size), or the candidate's own interval
  above the gate's bound (maxFallbackRate, ...; p95LatencyMs: more than 5% of decisions slower than it);
- Pass: the interval lies at or below the tolerated regression, with minRequests decisions from both versions; or,
  once the hold is over (the longest a step holds), the estimate is within it, with minRequests from both;
- Pending otherwise: the step holds. A Pending gate at the end of the hold is not enough evidence (NoData).
Each row says when a verdict should come: the decisions it needs if the rates stay as seen, and the time that takes
at the traffic seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arbiter_operator.api.promotion import MAX_VIOLATIONS_PER_DECISION, AnalysisRun, CheckResult, GateEvidence
from arbiter_operator.promotion.promql import LOW_CONFIDENCE_REASON
from arbiter_operator.promotion.sequential import (
    Difference,
    Share,
    difference,
    floor_verdict,
    growth_for_verdict,
    mix_verdict,
    verdict_of,
)
from arbiter_operator.promotion.values import as_number, count, counts, fmt, pct, points

if TYPE_CHECKING:
    from arbiter_operator.promotion.analysis import AnalysisQuery

# p95 <= bound exactly when at most 5% of decisions are slower than the bound.
P95_SLOW_SHARE = 0.05


@dataclass(frozen=True)
class Side:
    """One version's counts since the step began (prefix "" for the candidate, "stable_" for the stable version)."""

    values: Mapping[str, Any]
    prefix: str

    def num(self, name: str) -> float:
        return count(self.values, self.prefix + name)

    def counts(self, name: str) -> dict[str, float]:
        return counts(self.values.get(self.prefix + name))

    def decisions(self) -> float | None:
        n = as_number(self.values.get(self.prefix + "requests"))
        return None if n is None or n < 0 else n

    def share(self, hits: float, scale: float = 1.0) -> Share | None:
        n = self.decisions()
        return None if n is None else Share(min(hits, n * scale), n, scale)


def slow_threshold(buckets: Mapping[str, float], bound_ms: float) -> float | None:
    """The latency histogram's boundary (seconds) that counts decisions slower than the p95 bound: the smallest at or
    above it, else the largest finite one."""
    edges = sorted(e for e in (as_number(k) for k in buckets) if e is not None)
    if not edges:
        return None
    above = [e for e in edges if e >= bound_ms / 1000.0 - 1e-12]
    return above[0] if above else edges[-1]


def slow_share(buckets: Mapping[str, float], threshold: float) -> Share | None:
    """Decisions slower than `threshold` (a boundary) out of all, from cumulative bucket counts."""
    by_edge = {as_number(k): v for k, v in buckets.items()}
    total = buckets.get("+Inf")
    at = by_edge.get(threshold)
    if total is None or at is None:
        return None
    return Share(max(0.0, total - at), total)


@dataclass(frozen=True)
class Rate:
    """A counted gate comparing one share of the two versions."""

    name: str
    what: str
    candidate: Share | None
    stable: Share | None
    tolerated: float
    share_bound: float | None  # the candidate's own share must not be above it
    value: float | None  # what status shows: the candidate's share (latency: its p95 in ms)
    bound: float | None


@dataclass(frozen=True)
class Look:
    """What every row of one look shares."""

    alpha: float
    final: bool  # the hold is over
    need: float  # decisions each version must show before a pass
    elapsed: float  # seconds of evidence so far
    project: bool = True  # say when a verdict should come (the simulation benchmark, judging only, skips it)


def _rates(q: AnalysisQuery, values: Mapping[str, Any], p95: float | None) -> list[Rate]:
    c, s = Side(values, ""), Side(values, "stable_")
    e, b = q.sequential.effect if q.sequential else None, q.bounds
    assert e is not None
    out: list[Rate] = []
    if q.p95_bound_ms is not None:
        cb, sb = c.counts("latency_buckets"), s.counts("latency_buckets")
        edge = slow_threshold(cb, q.p95_bound_ms)
        cs, ss = (None, None) if edge is None else (slow_share(cb, edge), slow_share(sb, edge))
        exact = edge is not None and edge * 1000.0 >= q.p95_bound_ms - 1e-9
        what = "p95 latency: decisions slower than " + ("the bound" if edge is None else f"{edge * 1000.0:g}ms")
        out.append(Rate("p95LatencyMs", what, cs, ss, e.slowDecisionRate, P95_SLOW_SHARE if exact else None, p95,
                        q.p95_bound_ms))
    low = LOW_CONFIDENCE_REASON

    def rate(name: str, what: str, hits: Callable[[Side], float], tolerated: float, bound: float | None,
             scale: float = 1.0) -> Rate:
        cand = c.share(hits(c), scale)
        return Rate(name, what, cand, s.share(hits(s), scale), tolerated, bound, cand.rate if cand else None, bound)

    def reason(r: str) -> Callable[[Side], float]:
        return lambda v: v.counts("fallback_reasons").get(r, 0.0)

    out += [
        rate("errorRate", "error rate", lambda v: v.num("errors"), e.errorRate, q.max_error_rate),
        rate("fallbackRate", "fallback rate", lambda v: v.num("fallbacks"), e.fallbackRate, b.max_fallback_rate),
        *(rate(f"fallbackRate/{r}", f"fallback rate ({r})", reason(r), e.fallbackRate, bound)
          for r, bound in sorted(b.max_fallback_by_reason.items())),
        rate("lowConfidenceRate", "low-confidence rate",
             lambda v: v.num("low_confidence") + v.counts("fallback_reasons").get(low, 0.0), e.lowConfidenceRate,
             b.max_low_confidence_rate),
        rate("schemaViolationRate", "schema violation rate", lambda v: v.num("schema_violations"),
             e.schemaViolationRate, b.max_schema_violation_rate, MAX_VIOLATIONS_PER_DECISION),
    ]
    return out


def _projection(decides: Callable[[float], bool], decisions: float, look: Look) -> tuple[float | None, float | None]:
    """(candidate decisions a verdict needs, seconds until then at the traffic seen) if the rates stay as seen."""
    elapsed = look.elapsed
    if decisions <= 0 or not look.project:
        return None, None
    k = growth_for_verdict(decides)
    if k is None:
        return None, None
    return k * decisions, (k - 1.0) * elapsed if elapsed > 0 else None


def _row(name: str, verdict: str, message: str, value: float | None, bound: float | None,
         evidence: GateEvidence, direction: str = "max") -> CheckResult:
    return CheckResult(name=name, value=value, bound=bound, direction=direction, verdict=verdict, message=message,
                       evidence=evidence)


def _why_pending(enough: bool, over: bool) -> str:
    if not enough:
        return "too few decisions yet"
    return "above the tolerated regression but within noise" if over else "not decided yet"


def _wait(needed: float | None, seconds: float | None) -> str:
    if needed is None:
        return "no verdict expected at these rates"
    return f"a verdict after about {needed:,.0f} decisions" + ("" if seconds is None else f" (~{seconds:.0f}s)")


def _rate_check(r: Rate, look: Look) -> CheckResult:
    if r.candidate is None or r.stable is None:
        return CheckResult(name=r.name, value=r.value, bound=r.bound, verdict="NoData",
                           message=f"{r.what}: no data from {'the candidate' if r.candidate is None else 'stable'}")
    cand, stable = r.candidate, r.stable

    def decides(k: float, final: bool = look.final) -> bool:
        d = difference(cand.grown(k), stable.grown(k), look.alpha)
        v = verdict_of(d, r.tolerated, r.share_bound)
        enough = min(cand.trials, stable.trials) * k >= look.need
        within = d.estimate <= r.tolerated and (r.share_bound is None or (cand.rate or 0.0) <= r.share_bound)
        return v == "worse" or (enough and (v == "fine" or (final and within)))

    d = difference(cand, stable, look.alpha)
    v = verdict_of(d, r.tolerated, r.share_bound)
    enough = min(cand.trials, stable.trials) >= look.need
    over = d.estimate > r.tolerated or (r.share_bound is not None and (cand.rate or 0.0) > r.share_bound)
    needed, seconds = _projection(decides, cand.trials, look)
    evidence = GateEvidence(estimate=d.estimate, lower=d.lower, upper=d.upper, tolerated=r.tolerated, alpha=look.alpha,
                            decisions=cand.trials, stableDecisions=stable.trials, decisionsNeeded=needed,
                            secondsToVerdict=seconds)
    head = (f"{r.what} {pct(cand.rate)} vs stable {pct(stable.rate)}: {points(d.estimate)} points "
            f"[{points(d.lower)}, {points(d.upper)}]")
    if v == "worse":
        if d.lower > r.tolerated:
            why = f"{head}, more than the tolerated {points(r.tolerated)}"
        else:
            why = f"{r.what} {pct(cand.rate)} [{pct(d.candidate_lower)}, {pct(d.candidate_upper)}] above max " \
                  f"{pct(r.share_bound)}"
        return _row(r.name, "Fail", why, r.value, r.bound, evidence)
    if enough and (v == "fine" or (look.final and not over)):
        how = "within" if v == "fine" else "at the end of the hold, estimate within"
        return _row(r.name, "Pass", f"{head}, {how} the tolerated {points(r.tolerated)}", r.value, r.bound, evidence)
    return _row(r.name, "Pending", f"{head}: {_why_pending(enough, over)}, {_wait(needed, seconds)}", r.value,
                r.bound, evidence)


def _label_diffs(cand: Mapping[str, float], stable: Mapping[str, float], k: float, alpha: float) -> list[Difference]:
    ct, st = sum(cand.values()), sum(stable.values())
    labels = sorted(set(cand) | set(stable))
    return [difference(Share(cand.get(x, 0.0) * k, ct * k), Share(stable.get(x, 0.0) * k, st * k),
                       alpha / len(labels)) for x in labels]


def _mix_check(q: AnalysisQuery, values: Mapping[str, Any], look: Look, tolerated: float) -> CheckResult:
    """The decision mix: every label's share, candidate against stable (the alpha split over the labels)."""
    cand, stable = counts(values.get("labels")), counts(values.get("stable_labels"))
    ct, st = sum(cand.values()), sum(stable.values())
    if not cand or not stable:
        return CheckResult(name="decisionMixShift", bound=tolerated, verdict="NoData",
                           message="decision mix shift: no data (no decision mix from both versions)")
    labels = sorted(set(cand) | set(stable))

    def decides(k: float, final: bool = look.final) -> bool:
        if ct <= 0 or st <= 0:
            return False
        diffs = _label_diffs(cand, stable, k, look.alpha)
        v = mix_verdict(diffs, tolerated)
        enough = min(ct, st) * k >= look.need
        within = max(abs(d.estimate) for d in diffs) <= tolerated
        return v == "worse" or (enough and (v == "fine" or (final and within)))

    diffs = _label_diffs(cand, stable, 1.0, look.alpha) if ct > 0 and st > 0 else []
    v = mix_verdict(diffs, tolerated) if diffs else "open"
    at = max(range(len(diffs)), key=lambda i: abs(diffs[i].estimate), default=None)
    d = diffs[at] if at is not None else None
    shift = abs(d.estimate) if d else None
    enough = min(ct, st) >= look.need
    needed, seconds = _projection(decides, ct, look)
    evidence = GateEvidence(estimate=d.estimate if d else None, lower=d.lower if d else None,
                            upper=d.upper if d else None, tolerated=tolerated, alpha=look.alpha, decisions=ct,
                            stableDecisions=st, decisionsNeeded=needed, secondsToVerdict=seconds)
    head = "decision mix shift " + ("n/a" if d is None or at is None else
                                    f"{points(d.estimate)} points on {labels[at]!r} [{points(d.lower)}, "
                                    f"{points(d.upper)}]")
    if v == "worse":
        bad = next(i for i, x in enumerate(diffs) if x.lower > tolerated or x.upper < -tolerated)
        x = diffs[bad]
        msg = (f"decision mix shift {points(x.estimate)} points on {labels[bad]!r} [{points(x.lower)}, "
               f"{points(x.upper)}], more than the tolerated {pct(tolerated)}")
        return _row("decisionMixShift", "Fail", msg, shift, tolerated, evidence)
    over = shift is not None and shift > tolerated
    if enough and (v == "fine" or (look.final and not over)):
        how = "within" if v == "fine" else "at the end of the hold, estimate within"
        return _row("decisionMixShift", "Pass", f"{head}, {how} the tolerated {pct(tolerated)}", shift, tolerated,
                    evidence)
    return _row("decisionMixShift", "Pending", f"{head}: {_why_pending(enough, over)}, {_wait(needed, seconds)}",
                shift, tolerated, evidence)


def _agreement_check(q: AnalysisQuery, values: Mapping[str, Any], look: Look) -> CheckResult:
    """Shadow agreement against its floor (one share: both versions judged the same mirrored requests)."""
    floor, need = q.bounds.min_agreement or 0.0, max(1, q.bounds.min_compared)
    agree = counts(values.get("shadow_agree"))
    n = agree.get("true", 0.0) + agree.get("false", 0.0)
    share = Share(agree.get("true", 0.0), n)

    def decides(k: float) -> bool:
        v, _, _ = floor_verdict(share.grown(k), floor, look.alpha)
        return v == "worse" or (n * k >= need and (v == "fine" or (look.final and (share.rate or 0.0) >= floor)))

    v, lo, hi = floor_verdict(share, floor, look.alpha)
    needed, seconds = _projection(decides, n, look)
    evidence = GateEvidence(estimate=share.rate, lower=lo, upper=hi, tolerated=floor, alpha=look.alpha, decisions=n,
                            decisionsNeeded=needed, secondsToVerdict=seconds)
    head = f"shadow agreement {pct(share.rate)} [{pct(lo)}, {pct(hi)}] of {n:.0f} compared"
    if v == "worse":
        return _row("agreement", "Fail", f"{head}, below min {pct(floor)}", share.rate, floor, evidence, "min")
    if n >= need and (v == "fine" or (look.final and (share.rate or 0.0) >= floor)):
        return _row("agreement", "Pass", f"{head}, at or above min {pct(floor)}", share.rate, floor, evidence, "min")
    why = "too few comparisons yet" if n < need else "not decided yet"
    return _row("agreement", "Pending", f"{head}: {why}, {_wait(needed, seconds)}", share.rate, floor, evidence,
                "min")


def sequential_checks(q: AnalysisQuery, values: Mapping[str, Any], p95: float | None,
                      project: bool = True) -> list[CheckResult]:
    """The counted gates of one Sequential look, in status order (`project`: with when each verdict should come)."""
    assert q.sequential is not None
    rates = _rates(q, values, p95)
    gates = len(rates) + (1 if q.stable is not None else 0) + (1 if q.shadow else 0)
    look = Look(alpha=q.sequential.gate_alpha(gates), final=q.final, need=max(1, q.min_requests),
                elapsed=float(q.window_seconds), project=project)
    rows = [_rate_check(r, look) for r in rates]
    if q.stable is not None:
        rows.append(_mix_check(q, values, look, q.sequential.effect.decisionMixShift))
    if q.shadow:
        rows.append(_agreement_check(q, values, look))
    return rows


def judge_sequential(q: AnalysisQuery, values: Mapping[str, Any], others: list[CheckResult], p95: float | None,
                     common: dict[str, Any]) -> AnalysisRun:
    """One Sequential look: Fail on any failed gate; Inconclusive while a gate has no data; Pass when every gate
    passed; else Pending (NoData once the hold is over: not enough evidence, which never passes a step)."""
    assert q.sequential is not None
    checks = sequential_checks(q, values, p95) + others
    common = {**common, "checks": checks}
    stable = Side(values, "stable_").decisions()
    alpha = checks[0].evidence.alpha if checks and checks[0].evidence else q.sequential.false_rollback_rate
    numbers = (f"{Side(values, '').decisions() or 0:.0f} decisions since the step began ({q.stable} "
               f"{stable or 0:.0f}), p95 {fmt(p95, 'ms')}; falseRollbackRate {pct(q.sequential.false_rollback_rate)}, "
               f"{pct(alpha)} per gate")
    verdict = look_verdict(checks, q.final)
    if verdict == "Fail":
        failed = [c.message for c in checks if c.verdict == "Fail"]
        return AnalysisRun(verdict="Fail", message=f"{q.version}: {'; '.join(failed)}: {numbers}", **common)
    if verdict == "Inconclusive":
        missing = [c.name for c in checks if c.verdict == "NoData"]
        return AnalysisRun(verdict="Inconclusive", message=f"{q.version}: no data for {', '.join(missing)}: {numbers}",
                           **common)
    if verdict != "Pass":
        pending = [c.message for c in checks if c.verdict == "Pending"]
        word = "not enough evidence at the end of the hold" if q.final else "evidence so far"
        return AnalysisRun(verdict=verdict, message=f"{q.version}: {word}: {'; '.join(pending)}: {numbers}", **common)
    how = "at the end of the hold" if q.final else "before the end of the hold"
    return AnalysisRun(verdict="Pass", message=f"{q.version}: every gate passed {how}: {numbers}; "
                       + "; ".join(c.message for c in checks), **common)


def look_verdict(checks: list[CheckResult], final: bool) -> str:
    """The verdict of one Sequential look from its rows: Fail on any failed gate; Inconclusive while a gate has no
    data; Pass when every gate passed; else Pending before the end of the hold, NoData after it."""
    verdicts = {c.verdict for c in checks}
    if "Fail" in verdicts:
        return "Fail"
    if "NoData" in verdicts:
        return "Inconclusive"
    if "Pending" in verdicts:
        return "NoData" if final else "Pending"
    return "Pass"
