"""`status.promotion.history`: the last real outcomes, never pushed out by superseded attempts (pure).

Real outcomes (Succeeded, RolledBack, a user's abort) are kept, the last HISTORY_LIMIT of them. Attempts superseded
by another `spec.promote` change before they finished are counted in one record (reason Superseded, `count`), placed
where the last of them happened: a storm of promote flips adds to that count instead of replacing the history.
"""

from __future__ import annotations

from collections.abc import Sequence

from arbiter_operator.api.promotion import PromotionRecord

HISTORY_LIMIT = 10  # real outcomes kept; the one Superseded record comes on top
SUPERSEDED = "Superseded"


def _superseded(r: PromotionRecord) -> bool:
    return r.reason == SUPERSEDED


def _merge(records: Sequence[PromotionRecord]) -> PromotionRecord:
    """One record for these superseded attempts: the last one's version and finish, the first one's start, their
    time summed, their count summed (a record read back without a count stands for one)."""
    last = records[-1]
    return last.model_copy(update={
        "startedAt": records[0].startedAt,
        "durationSeconds": sum(r.durationSeconds for r in records),
        "count": sum(r.count or 1 for r in records),
    })


def append_record(history: Sequence[PromotionRecord], rec: PromotionRecord,
                  limit: int = HISTORY_LIMIT) -> list[PromotionRecord]:
    """`history` with `rec` added. Whatever was read back (several Superseded records, more than `limit`), the result
    holds the last `limit` real outcomes in order and at most one Superseded record, counting every one it absorbed."""
    items = [*history, rec]
    real = [r for r in items if not _superseded(r)]
    kept = real[-limit:] if limit > 0 else []
    sup = [r for r in items if _superseded(r)]
    if not sup:
        return kept
    last = max(i for i, r in enumerate(items) if _superseded(r))
    before = sum(1 for r in items[:last] if not _superseded(r))  # real outcomes that came before the last attempt
    at = max(0, before - (len(real) - len(kept)))
    return [*kept[:at], _merge(sup), *kept[at:]]
