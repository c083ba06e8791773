"""Always-valid statistics of the Sequential analysis mode (pure: no I/O, no clock; docs/operations.md, "Sequential
analysis").

The one primitive is a confidence sequence for the mean of observations in [0, 1] (a share of decisions: fallbacks,
errors, low confidence, slow decisions, one label of the decision mix, agreement; schema violations per decision
divided by the most one decision can have). It is the beta-binomial mixture of likelihood ratios (Robbins' method of
mixtures): for a Beta(a, b) mixing distribution over the rate,

    M_n(mu) = B(a + S, b + n - S) / B(a, b) / (mu^S (1 - mu)^(n - S))       S: the sum of the n observations

is a nonnegative supermartingale when the observations have mean mu, whatever their values in [0, 1] (the Bernoulli
likelihood ratio is convex in the observation, so its expectation is at most that of a 0/1 observation with the same
mean). By Ville's inequality, M_n(mu) reaches 1/alpha at any n with probability at most alpha, so the set
{mu : M_n(mu) < 1/alpha} covers the true rate at every look at once: looking after every decision or once a minute
spends the same alpha. It depends on the counts alone (S and n), which is what Prometheus's counters give.

Two versions are compared through one interval each, at half the alpha each (a union bound): the difference
candidate - stable lies in [L_c - U_s, U_c - L_s] at every look with probability at least 1 - alpha. Jeffreys' mixing
distribution Beta(1/2, 1/2) keeps the interval tight at the small rates the gates watch (a 1% fallback rate).

Why not a library: none on PyPI's lists computes confidence sequences (confseq is C++ with a build step and no wheels
for this platform); the interval is a root of a concave function of one variable, found here by safeguarded Newton
steps (measured: about 10 iterations per bound; the simulation benchmark computes millions of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# Jeffreys' Beta(1/2, 1/2): the mixing distribution over the rate.
PRIOR_A = 0.5
PRIOR_B = 0.5
_LOG_BETA_PRIOR = math.lgamma(PRIOR_A) + math.lgamma(PRIOR_B) - math.lgamma(PRIOR_A + PRIOR_B)
_TOLERANCE = 1e-10


def _log_mixture(hits: float, trials: float) -> float:
    """log of the mixture's marginal likelihood: log B(a + S, b + n - S) - log B(a, b)."""
    misses = trials - hits
    return (math.lgamma(PRIOR_A + hits) + math.lgamma(PRIOR_B + misses) - math.lgamma(PRIOR_A + PRIOR_B + trials)
            - _LOG_BETA_PRIOR)


def _root(f: Callable[[float], float], df: Callable[[float], float], lo: float, hi: float, f_lo: float,
          guess: float) -> float:
    """The root of f in [lo, hi], where f(lo) and f(hi) have opposite signs: Newton steps from `guess` kept inside
    the bracket, bisection where a step would leave it, until f is zero to 1e-10 or the bracket is as narrow as
    floats go."""
    x = guess if lo < guess < hi else (lo + hi) / 2
    for _ in range(200):
        fx = f(x)
        if abs(fx) < 1e-10:
            return x
        if (fx < 0) == (f_lo < 0):
            lo, f_lo = x, fx
        else:
            hi = x
        slope = df(x)
        step = x - fx / slope if slope != 0 else lo
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return x
        x = step if lo < step < hi else mid
    return x


def interval(hits: float, trials: float, alpha: float) -> tuple[float, float]:
    """The always-valid (1 - alpha) interval of the mean of `trials` observations in [0, 1] summing to `hits`.

    Counts may be fractional (Prometheus's increase() extrapolates); hits is clamped to [0, trials]. No trials: the
    whole of [0, 1]."""
    if not trials > 0 or not 0 < alpha < 1:
        return 0.0, 1.0
    hits = min(max(hits, 0.0), trials)
    misses = trials - hits
    # log L(mu) - log m - log(1/alpha): positive inside the interval; concave in mu.
    level = _log_mixture(hits, trials) + math.log(alpha)

    def f(mu: float) -> float:
        return (hits * math.log(mu) if hits else 0.0) + (misses * math.log1p(-mu) if misses else 0.0) - level

    def df(mu: float) -> float:
        return hits / mu - misses / (1 - mu)

    # Beyond these the interval reaches 0 or 1 (as far as floats tell): its end is 0 or 1 when f is still positive.
    tiny, most = 1e-300, 1.0 - 2**-52
    centre = min(max(hits / trials, tiny), most)
    top = f(centre)
    if top <= 0:  # only where rounding ate the counts (f is positive at the observed rate)
        return centre, centre
    # The normal approximation's ends start the search: f is nearly quadratic around the rate.
    half = math.sqrt(2 * top * centre * (1 - centre) / trials)
    f_tiny, f_most = f(tiny), f(most)
    lower = 0.0 if hits == 0 or f_tiny >= 0 else _root(f, df, tiny, centre, f_tiny, centre - half)
    upper = 1.0 if misses == 0 or f_most >= 0 else _root(f, df, centre, most, top, centre + half)
    return lower, upper


@dataclass(frozen=True)
class Share:
    """A share observed so far: the sum of the observations (each in [0, 1] after dividing by `scale`) and their
    number. `scale` is the most one observation can be (schema violations: the attempts one decision may make)."""

    hits: float
    trials: float
    scale: float = 1.0

    @property
    def rate(self) -> float | None:
        return None if self.trials <= 0 else self.hits / self.trials

    def interval(self, alpha: float) -> tuple[float, float]:
        lo, hi = interval(self.hits / self.scale, self.trials, alpha)
        return lo * self.scale, hi * self.scale

    def grown(self, factor: float) -> Share:
        """The same rate over `factor` times the observations (what the evidence would be at the current rates)."""
        return Share(self.hits * factor, self.trials * factor, self.scale)


@dataclass(frozen=True)
class Difference:
    """candidate - stable: the point estimate and its always-valid interval (each side's at alpha / 2)."""

    estimate: float
    lower: float
    upper: float
    candidate_lower: float  # the candidate's own interval, for absolute bounds
    candidate_upper: float


def difference(candidate: Share, stable: Share, alpha: float) -> Difference:
    c_lo, c_hi = candidate.interval(alpha / 2)
    s_lo, s_hi = stable.interval(alpha / 2)
    c_rate, s_rate = candidate.rate or 0.0, stable.rate or 0.0
    return Difference(c_rate - s_rate, c_lo - s_hi, c_hi - s_lo, c_lo, c_hi)


def verdict_of(diff: Difference, tolerated: float, bound: float | None = None) -> str:
    """"worse": evidence of a regression larger than `tolerated`, or of the candidate's own share above `bound`;
    "fine": evidence of no regression larger than `tolerated`; "open": neither yet."""
    if diff.lower > tolerated or (bound is not None and diff.candidate_lower > bound):
        return "worse"
    if diff.upper <= tolerated:
        return "fine"
    return "open"


def mix_verdict(diffs: list[Difference], tolerated: float) -> str:
    """The decision mix: worse when some label's share moved by more than `tolerated` either way (with evidence),
    fine when every label's interval lies within +-tolerated."""
    if any(d.lower > tolerated or d.upper < -tolerated for d in diffs):
        return "worse"
    if diffs and all(d.lower >= -tolerated and d.upper <= tolerated for d in diffs):
        return "fine"
    return "open"


def floor_verdict(share: Share, floor: float, alpha: float) -> tuple[str, float, float]:
    """One share against a floor (shadow agreement >= minAgreement): (verdict, lower, upper)."""
    lo, hi = share.interval(alpha)
    if hi < floor:
        return "worse", lo, hi
    if lo >= floor:
        return "fine", lo, hi
    return "open", lo, hi


# A verdict further away than this many times the evidence so far is "not expected" (a difference about the size of
# the tolerated one may never be told apart from it).
_HORIZON = 1 << 16


def growth_for_verdict(decides: Callable[[float], bool]) -> float | None:
    """The least factor k >= 1 by which the evidence must grow, at the rates observed so far, for `decides(k)` to
    hold; None when not within _HORIZON. `decides` must turn true and stay true as k grows (the intervals narrow)."""
    if decides(1.0):
        return 1.0
    lo, hi = 1.0, 2.0
    while not decides(hi):
        lo, hi = hi, hi * 2
        if hi > _HORIZON:
            return None
    for _ in range(12):  # to within 0.03% of the factor: the estimate is rough anyway (rates drift)
        mid = (lo + hi) / 2
        if decides(mid):
            hi = mid
        else:
            lo = mid
    return hi
