"""The Sequential mode's statistics (promotion/sequential.py), as properties: the always-valid interval holds the
rates it should, at any look, whatever the counts; a regression is told apart from the tolerated one, in the right
direction; and the projection of when a verdict comes is a verdict indeed."""

from __future__ import annotations

import math
import random

import numpy
import pytest
from arbiter_operator.api.promotion import MAX_VIOLATIONS_PER_DECISION
from arbiter_operator.promotion.sequential import (
    Share,
    difference,
    floor_verdict,
    growth_for_verdict,
    interval,
    mix_verdict,
    verdict_of,
)
from arbiter_runtime.contract import Upstream
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

counts = st.floats(min_value=0, max_value=1e7, allow_nan=False)
alphas = st.floats(min_value=1e-6, max_value=0.5)


def log_martingale(hits: float, trials: float, mu: float) -> float:
    """log M_n(mu), written out independently of the module: the mixture's marginal likelihood over mu's."""
    a = b = 0.5
    log_beta = math.lgamma(a + hits) + math.lgamma(b + trials - hits) - math.lgamma(a + b + trials)
    log_prior = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    lik = (hits * math.log(mu) if hits else 0.0) + ((trials - hits) * math.log1p(-mu) if trials - hits else 0.0)
    return log_beta - log_prior - lik


@settings(max_examples=400, deadline=None)
@example(hits=0.0, trials=1e6, alpha=0.01)
@example(hits=3.0, trials=3.0, alpha=0.05)
@example(hits=0.5, trials=0.7, alpha=0.05)  # Prometheus's extrapolated counts are fractional
@given(hits=counts, trials=counts, alpha=alphas)
def test_the_interval_is_exactly_where_the_martingale_stays_under_one_over_alpha(hits, trials, alpha):
    hits = min(hits, trials)
    lo, hi = interval(hits, trials, alpha)
    assert 0.0 <= lo <= hi <= 1.0
    if trials <= 0:
        assert (lo, hi) == (0.0, 1.0)
        return
    rate = hits / trials
    assert lo <= rate + 1e-9 and rate - 1e-9 <= hi
    # Inside: the martingale is under 1/alpha; just outside: it has reached it (the ends are the roots).
    for mu in (lo, hi):
        if 1e-12 < mu < 1 - 1e-12:
            assert log_martingale(hits, trials, mu) == pytest.approx(math.log(1 / alpha), abs=1e-4)
    inside = (lo + hi) / 2
    if 0 < inside < 1:
        assert log_martingale(hits, trials, inside) < math.log(1 / alpha)


@settings(max_examples=200, deadline=None)
@given(hits=st.floats(0, 1e5), trials=st.floats(1, 1e5), alpha=alphas, more=st.floats(1.0, 1e3))
def test_more_evidence_at_the_same_rate_narrows_the_interval_and_a_lower_alpha_widens_it(hits, trials, alpha, more):
    hits = min(hits, trials)
    lo, hi = interval(hits, trials, alpha)
    lo2, hi2 = interval(hits * more, trials * more, alpha)
    assert hi2 - lo2 <= hi - lo + 1e-9
    lo3, hi3 = interval(hits, trials, alpha / 10)
    assert lo3 <= lo + 1e-9 and hi3 >= hi - 1e-9


@settings(max_examples=60, deadline=None)
@given(rate=st.sampled_from([0.001, 0.01, 0.05, 0.35, 0.9]), seed=st.integers(0, 2**32 - 1))
def test_the_interval_covers_the_true_rate_at_every_look_of_a_simulated_stream(rate, seed):
    # One stream, 200 looks: coverage must hold at all of them at once (alpha 1e-4: a miss here is not chance).
    rng = random.Random(seed)
    hits = trials = 0
    for _ in range(200):
        batch = rng.randint(1, 200)
        hits += sum(rng.random() < rate for _ in range(batch))
        trials += batch
        lo, hi = interval(hits, trials, 1e-4)
        assert lo <= rate <= hi, (hits, trials)


def test_the_false_alarm_rate_over_many_looks_stays_under_alpha():
    # 2,000 identical pairs (1% fallbacks), looked at 60 times each: the union of the two intervals must exclude
    # "no difference" in at most alpha of them, however often they are looked at (fixed seed: deterministic).
    rng = numpy.random.default_rng(7)
    alpha, alarms = 0.05, 0
    cand = rng.binomial(25, 0.01, size=(2000, 60)).cumsum(axis=1)
    stable = rng.binomial(225, 0.01, size=(2000, 60)).cumsum(axis=1)
    for c, s in zip(cand, stable, strict=True):
        for look in range(60):
            d = difference(Share(c[look], 25 * (look + 1)), Share(s[look], 225 * (look + 1)), alpha)
            if d.lower > 0 or d.upper < 0:
                alarms += 1
                break
    assert alarms / 2000 <= alpha


@settings(max_examples=300, deadline=None)
@given(pc=st.floats(0, 1), ps=st.floats(0, 1), n=st.floats(1, 1e6), ratio=st.floats(0.01, 100),
       tolerated=st.floats(0.001, 0.5), alpha=alphas)
def test_a_verdict_follows_the_interval_of_the_difference(pc, ps, n, ratio, tolerated, alpha):
    cand, stable = Share(pc * n, n), Share(ps * n * ratio, n * ratio)
    d = difference(cand, stable, alpha)
    assert d.lower <= d.estimate + 1e-9 and d.estimate - 1e-9 <= d.upper
    assert d.estimate == pytest.approx(pc - ps, abs=1e-9)
    v = verdict_of(d, tolerated)
    assert v == ("worse" if d.lower > tolerated else "fine" if d.upper <= tolerated else "open")
    # A regression is never "fine" while the interval still allows one above the tolerated size, and vice versa.
    if v == "worse":
        assert d.lower > tolerated
    if v == "fine":
        assert d.upper <= tolerated


def test_a_large_regression_is_worse_and_none_is_fine_with_enough_decisions():
    assert verdict_of(difference(Share(300, 1000), Share(90, 9000), 0.004), 0.01) == "worse"  # 30% vs 1%
    assert verdict_of(difference(Share(100, 10000), Share(900, 90000), 0.004), 0.01) == "fine"  # 1% vs 1%
    assert verdict_of(difference(Share(1, 100), Share(9, 900), 0.004), 0.01) == "open"  # too few to tell
    # The candidate's own share above an absolute bound is worse even when the stable is as bad.
    d = difference(Share(5e5, 1e6), Share(4.5e6, 9e6), 0.004)
    assert verdict_of(d, 0.01) == "fine" and verdict_of(d, 0.01, bound=0.05) == "worse"


def test_the_mix_is_worse_when_any_label_moves_either_way_and_fine_when_none_can():
    big = 1e6
    same = [difference(Share(0.35 * big, big), Share(0.35 * big, big), 0.001)] * 3
    assert mix_verdict(same, 0.05) == "fine"
    down = difference(Share(0.10 * big, big), Share(0.35 * big, big), 0.001)
    assert mix_verdict([same[0], down], 0.05) == "worse"
    assert mix_verdict([difference(Share(5, 10), Share(3, 10), 0.001)], 0.05) == "open"
    assert mix_verdict([], 0.05) == "open"


def test_agreement_against_its_floor():
    assert floor_verdict(Share(1000, 1000), 0.95, 0.01)[0] == "fine"
    assert floor_verdict(Share(300, 1000), 0.95, 0.01)[0] == "worse"
    assert floor_verdict(Share(19, 20), 0.95, 0.01)[0] == "open"


@settings(max_examples=100, deadline=None)
@given(pc=st.floats(0, 0.5), ps=st.floats(0, 0.5), n=st.floats(1, 1e4), tolerated=st.floats(0.005, 0.2))
def test_the_projected_evidence_gives_a_verdict_and_less_does_not(pc, ps, n, tolerated):
    cand, stable = Share(pc * n, n), Share(ps * n * 9, n * 9)
    assume(abs((pc - ps) - tolerated) > 0.002)  # a difference at the tolerated one is never told apart

    def decides(k: float) -> bool:
        return verdict_of(difference(cand.grown(k), stable.grown(k), 0.004), tolerated) != "open"

    k = growth_for_verdict(decides)
    if k is None:
        return  # beyond the horizon: the projection says "no verdict expected" rather than guessing
    assert k >= 1 and decides(k)
    if k > 1.01:
        assert not decides(k / 1.01)


def test_violations_per_decision_are_bounded_by_the_attempts_the_rendered_runtime_makes():
    # Schema violations are scaled into [0, 1] by the most one decision can count (one per attempt).
    assert Upstream.model_fields["maxRetries"].default + 1 == MAX_VIOLATIONS_PER_DECISION
    lo, hi = Share(600, 1000, MAX_VIOLATIONS_PER_DECISION).interval(0.01)
    assert lo < 0.6 < hi <= MAX_VIOLATIONS_PER_DECISION
