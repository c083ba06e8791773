"""Sequential against Windowed canary analysis, simulated: how often each rolls back a candidate identical to the
stable version (A/A), and how fast each rolls back a regression, on the same simulated traffic. Pure and seeded: no
cluster, no clock; the product's own judging code decides every look (promotion.analysis.judge for the Windowed mode,
promotion.evidence for the Sequential one), on the counts Prometheus's counters would give.

The canary is spec.promote's default (steps 10% and 50%, each held 300 s; progressDeadlineSeconds 1800) with a p95
bound of 100 ms; the Windowed mode at its defaults (intervalSeconds 60, minRequests 50, the default bounds), the
Sequential mode at its defaults (lookSeconds 3, the default effect sizes) with falseRollbackRate alpha. Traffic: the
candidate decides R decisions/s at every step, the stable version the rest of the model's traffic at the step's
weight (9R at 10%, R at 50%). Both versions behave as BASE (the A/A canaries), or the candidate as one of REGRESSIONS.

    .venv/bin/python benchmarks/sequential_analysis.py [--canaries 1000] [--regression-canaries 200]
        [--rates 5,50,500] [--alphas 0.05,0.01] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from arbiter_operator.api.promotion import Analysis, PromoteSpec, PromotionStatus, SequentialAnalysis
from arbiter_operator.promotion.analysis import AnalysisQuery, analysis_due, judge
from arbiter_operator.promotion.evidence import look_verdict, sequential_checks
from arbiter_runtime.metrics import LATENCY_BUCKETS

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LABELS = ("approve", "review", "deny")
P95_BOUND_MS = 100
CHUNK = 1  # seconds of traffic per simulated chunk (a look falls on a whole number of them)


@dataclass(frozen=True)
class Behaviour:
    """A version's decisions: shares of each outcome, schema violations per decision, the label mix of answered
    decisions, and a log-normal decision latency."""

    errors: float = 0.001
    fallbacks: float = 0.01
    low_confidence: float = 0.05
    violations: float = 0.001
    mix: tuple[float, ...] = (0.355, 0.33, 0.315)
    median_ms: float = 40.0
    sigma: float = 0.5  # p95 91 ms, p99 128 ms

    def bucket_shares(self) -> np.ndarray:
        """Share of decisions in each latency bucket (the runtime's boundaries, then +Inf)."""
        cdf = [0.5 * (1 + math.erf(math.log(b * 1000 / self.median_ms) / (self.sigma * math.sqrt(2))))
               for b in LATENCY_BUCKETS]
        return np.diff([0.0, *cdf, 1.0])


BASE = Behaviour()
_OTHERS = (1 - 0.505) / (BASE.mix[1] + BASE.mix[2])
REGRESSIONS = {
    "fallback 1% -> 5%": replace(BASE, fallbacks=0.05),
    "decision mix +15 points on one label": replace(BASE, mix=(0.505, BASE.mix[1] * _OTHERS, BASE.mix[2] * _OTHERS)),
    # The same median, a longer tail: p99 128 -> 192 ms (p95 91 -> 121 ms, past the 100 ms bound).
    "p99 latency +50%": replace(BASE, sigma=math.log(1.5 * math.exp(0.5 * 2.3263)) / 2.3263),
}
# Per chunk: requests, errors, fallbacks, low confidence, violations, labels..., latency buckets...
_N, _ERR, _FB, _LOW, _VIOL, _LAB = 0, 1, 2, 3, 4, 5
_BUCKETS = _LAB + len(LABELS)


def chunks(rng: np.random.Generator, b: Behaviour, rate: float, count: int) -> np.ndarray:
    """`count` chunks of traffic from one version: its counts per chunk (columns as _N.. above)."""
    n = rng.poisson(rate * CHUNK, size=count)
    outcomes = rng.multinomial(n, [b.errors, b.fallbacks, b.low_confidence, 1 - b.errors - b.fallbacks
                                   - b.low_confidence])
    answered = n - outcomes[:, 0]
    labels = rng.multinomial(answered, list(b.mix))
    buckets = rng.multinomial(n, b.bucket_shares())
    violations = rng.binomial(n, b.violations)
    return np.column_stack([n, outcomes[:, 0], outcomes[:, 1], outcomes[:, 2], violations, labels, buckets])


def histogram_quantile(q: float, cumulative: list[float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative bucket counts (LATENCY_BUCKETS, then +Inf), in seconds."""
    total = cumulative[-1]
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper, at in zip(LATENCY_BUCKETS, cumulative, strict=False):
        if at >= rank:
            return lower + (upper - lower) * ((rank - below) / (at - below) if at > below else 0.0)
        lower, below = upper, at
    return LATENCY_BUCKETS[-1]


def side(counts: np.ndarray, prefix: str) -> dict[str, Any]:
    """One version's counts (a summed row) as the analysis's queries would return them."""
    cumulative = np.cumsum(counts[_BUCKETS:]).tolist()
    edges = [f"{b:g}" for b in LATENCY_BUCKETS] + ["+Inf"]
    fb = float(counts[_FB])
    return {
        f"{prefix}requests": float(counts[_N]), f"{prefix}errors": float(counts[_ERR]), f"{prefix}fallbacks": fb,
        f"{prefix}low_confidence": float(counts[_LOW]), f"{prefix}schema_violations": float(counts[_VIOL]),
        f"{prefix}fallback_reasons": {"upstream_error": fb},
        f"{prefix}labels": {x: float(v) for x, v in zip(LABELS, counts[_LAB:_BUCKETS], strict=True)},
        f"{prefix}latency_buckets": dict(zip(edges, cumulative, strict=True)),
    }


def values(cand: np.ndarray, stable: np.ndarray) -> dict[str, Any]:
    out = {**side(cand, ""), **side(stable, "stable_")}
    out["decision_p95"] = histogram_quantile(0.95, list(out["latency_buckets"].values()))
    out["vllm_p95"] = None
    return out


class Traffic:
    """Both versions' chunks of one step, drawn as the step goes on."""

    def __init__(self, rng: np.random.Generator, cand: Behaviour, cand_rate: float, stable_rate: float):
        self.rng, self.cand, self.rates = rng, cand, (cand_rate, stable_rate)
        self.c = np.zeros((0, _BUCKETS + len(LATENCY_BUCKETS) + 1), dtype=np.int64)
        self.s = self.c.copy()

    def upto(self, n: int) -> None:
        if n > len(self.c):
            more = max(n - len(self.c), 60)
            self.c = np.vstack([self.c, chunks(self.rng, self.cand, self.rates[0], more)])
            self.s = np.vstack([self.s, chunks(self.rng, BASE, self.rates[1], more)])

    def counts(self, start: int, end: int) -> dict[str, Any]:
        self.upto(end)
        return values(self.c[start:end].sum(axis=0), self.s[start:end].sum(axis=0))


def spec(mode: str, alpha: float) -> PromoteSpec:
    analysis = Analysis(p95LatencyMs=P95_BOUND_MS) if mode == "Windowed" else Analysis(
        mode="Sequential", p95LatencyMs=P95_BOUND_MS, sequential=SequentialAnalysis(falseRollbackRate=alpha))
    return PromoteSpec(version="v2", strategy="Canary", analysis=analysis)


def templates(s: PromoteSpec) -> list[tuple[AnalysisQuery, AnalysisQuery]]:
    """Per step, the analysis query of an interim look and of the final one (the counts vary, the query does not)."""
    out = []
    for i, step in enumerate(s.steps):
        st = PromotionStatus(phase="Progressing", stable="v1", candidate="v2", step=i, weight=step.weight,
                             stepStartedAt="2026-01-01T00:00:00Z")
        interim = analysis_due(s, st, T0 + timedelta(seconds=60), namespace="bench", model="m", sla_p95_ms=150)
        final = analysis_due(s, st, T0 + timedelta(seconds=step.holdSeconds), namespace="bench", model="m",
                             sla_p95_ms=150)
        assert interim is not None and final is not None
        out.append((interim, final))
    return out


def step_outcome(mode: str, traffic: Traffic, queries: tuple[AnalysisQuery, AnalysisQuery], look: int, hold: int,
                 deadline: int) -> tuple[str, int]:
    """("pass" | "rollback" | "deadline", seconds into the step), as the state machine acts on each look (every
    `look` seconds, and at the end of the hold)."""
    t = look
    while t < hold + deadline:
        final = t >= hold
        q = replace(queries[1] if final else queries[0], window_seconds=t)
        if mode == "Sequential":
            v = traffic.counts(0, t // CHUNK)
            verdict = look_verdict(sequential_checks(q, v, v["decision_p95"], project=False), final)
        else:
            v = traffic.counts(max(0, (t - look) // CHUNK), t // CHUNK)
            verdict = judge(q, v).verdict
        if verdict == "Fail":
            return "rollback", t
        if verdict == "Pass" and (final or mode == "Sequential"):
            return "pass", t
        t = min(t + look, hold) if t < hold else t + look
    return "deadline", hold + deadline


def canary(mode: str, s: PromoteSpec, queries: list[tuple[AnalysisQuery, AnalysisQuery]], cand: Behaviour,
           rate: float, rng: np.random.Generator) -> tuple[str, int]:
    """One promotion: its outcome ("promoted" | "rollback" | "deadline") and when (seconds since it started)."""
    spent = 0
    a = s.analysis
    look = a.sequential_settings().lookSeconds if mode == "Sequential" else a.intervalSeconds
    assert look % CHUNK == 0
    for step, q in zip(s.steps, queries, strict=True):
        traffic = Traffic(rng, cand, rate, rate * (100 - step.weight) / step.weight)
        outcome, at = step_outcome(mode, traffic, q, look, step.holdSeconds, s.progressDeadlineSeconds)
        spent += at
        if outcome != "pass":
            return outcome, spent
    return "promoted", spent


def run(mode: str, alpha: float, cand: Behaviour, rate: float, n: int, seed: int) -> dict[str, Any]:
    s = spec(mode, alpha)
    queries = templates(s)
    rng = np.random.default_rng(seed)
    outcomes = [canary(mode, s, queries, cand, rate, rng) for _ in range(n)]
    times = {k: sorted(t for o, t in outcomes if o == k) for k in ("promoted", "rollback", "deadline")}
    return {"mode": mode, "alpha": alpha if mode == "Sequential" else None, "rate": rate, "canaries": n,
            **{k: len(v) for k, v in times.items()},
            "median_promoted_s": statistics.median(times["promoted"]) if times["promoted"] else None,
            # Promoted or ended by the deadline: never rolled back by a gate (an infinite time to rollback).
            "median_rollback_s": _median_with_misses(times["rollback"], n)}


def _median_with_misses(times: list[int], n: int) -> float | None:
    """The median time to rollback over all canaries, those never rolled back counting as infinitely late."""
    padded = times + [math.inf] * (n - len(times))
    m = statistics.median(padded) if padded else None
    return None if m is None or math.isinf(m) else float(m)


def _s(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canaries", type=int, default=1000, help="A/A canaries per rate, alpha and mode")
    ap.add_argument("--regression-canaries", type=int, default=200, help="canaries per regression, rate and mode")
    ap.add_argument("--rates", default="5,50,500", help="candidate decisions per second")
    ap.add_argument("--alphas", default="0.05,0.01", help="falseRollbackRate values for the A/A canaries")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="JSON result path (default: benchmarks/results/sequential_analysis.json)")
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    alphas = [float(a) for a in args.alphas.split(",")]
    started = time.perf_counter()
    seed = args.seed * 1_000_003
    aa, regressions = [], []
    for rate in rates:
        for mode, alpha in [("Windowed", 0.05)] + [("Sequential", a) for a in alphas]:
            seed += 1
            common.log(f"A/A {mode} alpha={alpha} at {rate:g}/s: {args.canaries} canaries")
            aa.append(run(mode, alpha, BASE, rate, args.canaries, seed))
    for name, cand in REGRESSIONS.items():
        for rate in rates:
            pair = {}
            for mode in ("Windowed", "Sequential"):
                seed += 1
                common.log(f"{name}: {mode} at {rate:g}/s: {args.regression_canaries} canaries")
                pair[mode] = run(mode, 0.05, cand, rate, args.regression_canaries, seed)
            w, q = pair["Windowed"]["median_rollback_s"], pair["Sequential"]["median_rollback_s"]
            speedup = (math.inf if w is None else w / q) if q else None
            regressions.append({"regression": name, "rate": rate, **{m: r for m, r in pair.items()},
                                "speedup": speedup})
    print("## A/A canaries: the candidate is the stable version\n")
    print("| decisions/s | mode | falseRollbackRate | rolled back | deadline | promoted | median time to promote |")
    print("|---|---|---|---|---|---|---|")
    for r in aa:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:g}"
        print(f"| {r['rate']:g} | {r['mode']} | {alpha} | {r['rollback']}/{r['canaries']} "
              f"({r['rollback'] / r['canaries']:.1%}) | {r['deadline']} | {r['promoted']} | "
              f"{_s(r['median_promoted_s'])} |")
    print("\n## Regressions: median time to rollback (falseRollbackRate 0.05)\n")
    print("| regression | decisions/s | Windowed | Sequential | faster | not rolled back (W / S) |")
    print("|---|---|---|---|---|---|")
    for r in regressions:
        w, q = r["Windowed"], r["Sequential"]
        faster = "-" if r["speedup"] is None else ("inf" if math.isinf(r["speedup"]) else f"{r['speedup']:.1f}x")
        print(f"| {r['regression']} | {r['rate']:g} | {_s(w['median_rollback_s'])} | {_s(q['median_rollback_s'])} "
              f"| {faster} | {w['canaries'] - w['rollback']} / {q['canaries'] - q['rollback']} |")
    result = {"aa": aa, "regressions": regressions, "seed": args.seed,
              "seconds": round(time.perf_counter() - started, 1)}
    common.write_json(result, args.out, "sequential_analysis.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
