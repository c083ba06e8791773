"""Small readings of the apiserver's answers that every list/watch needs: a resourceVersion, a Status's reason, a
BOOKMARK's resourceVersion, a Retry-After header. Pure; each bounds what it takes from a possibly hostile peer."""

from __future__ import annotations

from typing import Any


def resource_version(value: Any) -> str:
    return value if isinstance(value, str) and 0 < len(value) <= 256 else ""


def status_reason(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "no Status"
    parts = [str(doc.get(k))[:200] for k in ("code", "reason", "message") if doc.get(k) is not None]
    return ": ".join(parts) or "an empty Status"


def bookmark_version(obj: Any) -> str:
    """The resourceVersion a BOOKMARK event carries, or "" where it carries none."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return resource_version(meta.get("resourceVersion")) if isinstance(meta, dict) else ""


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds; None for an HTTP date or garbage (the back-off alone decides)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None
