"""A file the operator's ConfigMap updates while the server runs (shadow.json, routing.json): read bounded, polled.

The kubelet swaps a mounted ConfigMap's files atomically, so a whole read is one version; polling (not inotify) because
the swap replaces a symlink that inotify watches of the old target never see."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


def read_bounded(path: str, limit: int) -> bytes:
    """The file's bytes, at most `limit + 1` (more says "too large" without reading it all); a missing file is empty,
    an unreadable one reads as a content of its own naming why (logged and counted once by the caller)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        return f"unreadable: {exc.strerror}".encode()


async def poll(reload: Callable[[], None], every_s: float, path: str, log: logging.Logger) -> None:
    """Call `reload` every `every_s` until cancelled; a defect in it is logged and never ends the polling (nor reaches
    a caller)."""
    while True:
        await asyncio.sleep(every_s)
        try:
            reload()
        except Exception:
            log.exception("reading %s failed", path)
