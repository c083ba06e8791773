"""Small pieces of the apiserver's wire format, read the same way by every watch the operator runs (pure)."""

from __future__ import annotations

from typing import Any


def resource_version(value: Any) -> str:
    return value if isinstance(value, str) and 0 < len(value) <= 256 else ""


def bookmark_version(obj: Any) -> str:
    """The resourceVersion a BOOKMARK event carries, or "" where it carries none."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return resource_version(meta.get("resourceVersion")) if isinstance(meta, dict) else ""


def status_reason(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "no Status"
    parts = [str(doc.get(k))[:200] for k in ("code", "reason", "message") if doc.get(k) is not None]
    return ": ".join(parts) or "an empty Status"


def retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:  # an HTTP date, or garbage: the back-off alone decides
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None
