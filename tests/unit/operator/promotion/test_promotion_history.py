"""History keeps outcomes: superseded attempts are counted in one record and never push a real outcome (Succeeded,
RolledBack, an abort) out of `status.promotion.history` (promotion/history.py, through the machine)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from arbiter_operator.api.promotion import PromotionRecord
from arbiter_operator.promotion.history import HISTORY_LIMIT, SUPERSEDED, append_record
from hypothesis import given, settings
from hypothesis import strategies as st
from test_promotion_machine import READY, Sim, canary, run_to_step

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REAL = [("Succeeded", "Promoted"), ("RolledBack", "AnalysisFailed"), ("RolledBack", "CandidateFailed"),
        ("Aborted", "Aborted"), ("Succeeded", "WarmSwitch")]


def _rec(i: int, kind: tuple[str, str], count: int | None = None) -> PromotionRecord:
    at = (T0 + timedelta(seconds=10 * i)).isoformat().replace("+00:00", "Z")
    return PromotionRecord(version=f"v{i}", outcome=kind[0], reason=kind[1], startedAt=at, finishedAt=at,
                           durationSeconds=1, count=count)


SUPER = ("Aborted", SUPERSEDED)
kinds = st.lists(st.sampled_from([*REAL, SUPER, SUPER, SUPER]), max_size=60)


@settings(max_examples=300, deadline=None)
@given(kinds, st.lists(st.sampled_from([*REAL, SUPER]), max_size=14), st.lists(st.integers(1, 50), min_size=14,
                                                                            max_size=14))
def test_real_outcomes_are_kept_and_superseded_attempts_counted(sequence, read_back, counts):
    # Whatever an earlier operator left (several Superseded records, counts, more than the limit) ...
    history = [_rec(-100 + i, k, counts[i] if k == SUPER else None) for i, k in enumerate(read_back)]
    absorbed = sum(r.count or 1 for r in history if r.reason == SUPERSEDED)
    real_seen = [r for r in history if r.reason != SUPERSEDED]
    for i, kind in enumerate(sequence):
        rec = _rec(i, kind)
        history = append_record(history, rec)
        if kind == SUPER:
            absorbed += 1
        else:
            real_seen.append(rec)
        if read_back or i:  # ... one append makes it whole again
            supers = [r for r in history if r.reason == SUPERSEDED]
            assert len(supers) <= 1
            assert [r for r in history if r.reason != SUPERSEDED] == real_seen[-HISTORY_LIMIT:]
            assert sum(r.count or 0 for r in supers) == absorbed
            assert len(history) <= HISTORY_LIMIT + 1
            finished = [r.finishedAt for r in history]
            assert finished == sorted(finished)  # still in the order things happened


def test_a_storm_of_promote_flips_keeps_the_real_outcomes():
    sim = Sim(spec=canary("v1", rollbackWindowSeconds=0))
    sim.stable_on("v1")
    sim.spec = canary("v2")
    run_to_step(sim, 0)
    sim.spec = canary("v1")  # back to stable: the user's abort, a real outcome
    sim.tick(after=1)
    sim.obs.pop("v2", None)
    sim.tick(after=1)
    before = [r for r in sim.status.history if r.reason != SUPERSEDED]
    assert [r.outcome for r in before] == ["Succeeded", "Aborted"]
    for i in range(30):  # a pipeline flapping spec.promote between two new versions, none ever finishing
        sim.spec = canary("v3" if i % 2 == 0 else "v2")
        sim.tick(after=1)
    history = sim.status.history
    assert [r for r in history if r.reason != SUPERSEDED] == before
    (superseded,) = [r for r in history if r.reason == SUPERSEDED]
    assert superseded.count == 29 and superseded.outcome == "Aborted"
    sim.obs[sim.status.candidate] = READY  # the last one goes through: a real outcome, after the count
    sim.measured(60)
    sim.measured(300)
    sim.measured(300)
    assert sim.status.stable == "v2", sim.status
    assert [r.reason for r in sim.status.history] == ["Promoted", "Aborted", SUPERSEDED, "Promoted"]
