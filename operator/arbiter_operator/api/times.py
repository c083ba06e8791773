"""RFC 3339 times as Kubernetes writes them in status (UTC, whole seconds, `Z`): the one format and parse."""

from __future__ import annotations

import functools
from datetime import UTC, datetime


# A pass formats its one `now` for every condition it sets (a hundred times and more per DecisionModel at creation):
# the text of the last few times is kept.
@functools.lru_cache(maxsize=256)
def format_time(value: datetime) -> str:
    """`2026-01-02T03:04:05Z`; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    """The aware datetime a status time stands for; None for a missing or malformed one (never raises)."""
    if not value:
        return None
    try:
        out = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return out if out.tzinfo else out.replace(tzinfo=UTC)
