"""Audit records: one structured JSON record per decision, to stdout and optionally to S3 in batches.

The record carries the input's sha256 digest, never the input itself (inputs are business data; the digest
proves which input was decided without copying it into logs). stdout gets every record at once, one line each,
so the cluster's log pipeline holds it even if the process dies a moment later. S3 gets the same lines in batches
(newline-delimited JSON objects, audit_s3.py), with object-lock retention where the bucket has object lock on.

Shutdown (`AuditLog.close(deadline)`) gives every sink until one deadline to take and store what it was given, and
counts per sink what it could not: the process exits non-zero when any record is missing from any sink.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import queue
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .audit_s3 import UNRETAINED_SUFFIX, S3BatchSink, S3Settings
from .audit_sinks import Sink, SinkStalled, StdoutSink, sink_name
from .jsonutil import dumps

__all__ = [
    "UNRETAINED_SUFFIX",
    "AuditLog",
    "S3BatchSink",
    "S3Settings",
    "Sink",
    "StdoutSink",
    "Trace",
    "now_iso",
    "trace_from_header",
]

log = logging.getLogger("arbiter.audit")

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class Trace:
    trace_id: str
    parent_id: str | None
    span_id: str
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        """The traceparent of this server's span, returned to the caller."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def trace_from_header(header: str | None) -> Trace:
    """Continue a W3C trace context (https://www.w3.org/TR/trace-context/) or start a new trace."""
    if header:
        m = _TRACEPARENT.match(header.strip().lower())
        if m and m.group(1) != "ff" and m.group(2) != "0" * 32 and m.group(3) != "0" * 16:
            return Trace(m.group(2), m.group(3), secrets.token_hex(8), m.group(4))
    return Trace(secrets.token_hex(16), None, secrets.token_hex(8))


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Writer:
    """One sink's queue and thread: a stalled sink holds up its own records only, never another sink's."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.name = sink_name(sink)
        self.queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.queued = 0  # handed to this writer, not yet taken by the sink (under AuditLog._cond)
        self.failed = 0  # the sink raised: not written
        self.thread: threading.Thread | None = None


class AuditLog:
    """Hands records to the sinks, each from its own writer thread, so a slow or stalled sink never blocks a request.

    The queues are bounded by reservation: a request reserves one slot per row *before* it is decided
    (`reserve`), so a decision that leaves the server always has room for its record; when the slots are used up
    (a sink is stalled) new requests are refused with 503 rather than decided without a record. `depth` is what
    is reserved or waiting for the slowest sink (arbiter_audit_queue_depth): every sink gets the records in the same
    order, so the records some sink has not taken are exactly those the slowest one has not.
    """

    def __init__(self, sinks: list[Sink], capacity: int = 10_000, on_write_error: Any = None):
        self.sinks = sinks
        self.capacity = capacity
        self._writers = [_Writer(sink) for sink in sinks]
        self._reserved = 0
        self._cond = threading.Condition()
        self._on_write_error = on_write_error
        self.recorded = 0
        for w in self._writers:
            w.thread = threading.Thread(target=self._run, args=(w,), name=f"audit-{w.name}", daemon=True)
            w.thread.start()

    @property
    def depth(self) -> int:
        return self._reserved + max((w.queued for w in self._writers), default=0)

    def reserve(self, n: int, limit: int | None = None) -> bool:
        """Hold n slots, unless that would take the queue past `limit` (default: the capacity)."""
        with self._cond:
            if self.depth + n > (self.capacity if limit is None else min(limit, self.capacity)):
                return False
            self._reserved += n
            return True

    def release(self, n: int) -> None:
        """Give back slots reserved for rows that will not be recorded (they did not leave the server)."""
        if n:
            with self._cond:
                self._reserved -= n
                self._cond.notify_all()

    def record(self, record: dict[str, Any], reserved: bool = True) -> None:
        line = dumps(record)
        with self._cond:  # one order for every sink's queue (`depth` relies on it)
            if reserved:
                self._reserved -= 1
            self.recorded += 1
            for w in self._writers:
                w.queued += 1
                w.queue.put(line)

    def _run(self, w: _Writer) -> None:
        while True:
            line = w.queue.get()
            if line is None:
                return
            try:
                w.sink.write(line)
            except SinkStalled:  # the shutdown deadline passed: this line and the rest stay counted in `queued`
                return
            except Exception as exc:  # a closed stdout, a sink bug: the other sinks go on regardless
                with self._cond:
                    w.failed += 1
                log.error("audit sink %s failed: %s", w.name, type(exc).__name__)
                if self._on_write_error is not None:
                    self._on_write_error(type(w.sink).__name__)
            with self._cond:
                w.queued -= 1
                self._cond.notify_all()

    def wait_written(self, timeout: float = 10.0) -> bool:
        """Block until every queued record is taken by every sink (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: all(w.queued == 0 for w in self._writers), timeout)

    async def close(self, deadline: float | None = None) -> dict[str, int]:
        """Let every sink take and store its records until `deadline` (time.monotonic(); default 20 s from now).

        Returns, per sink name, the records it did not write (0 each: nothing lost); logs the count per sink.
        """
        deadline = time.monotonic() + 20.0 if deadline is None else deadline
        lost = dict(zip([w.name for w in self._writers],
                        await asyncio.gather(*(self._finish(w, deadline) for w in self._writers)), strict=True))
        if any(lost.values()):
            log.error("audit records not written at shutdown: %s (of %d recorded)",
                      ", ".join(f"{name} {n}" for name, n in lost.items()), self.recorded)
        else:
            log.info("audit: all %d records written to %s", self.recorded, ", ".join(lost) or "no sink")
        return lost

    async def _finish(self, w: _Writer, deadline: float) -> int:
        stop_by = getattr(w.sink, "stop_by", None)
        if stop_by is not None:
            stop_by(deadline)
        w.queue.put(None)
        while w.thread is not None and w.thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        try:
            held = int(await w.sink.close(deadline) or 0)
        except Exception as exc:
            log.error("audit sink %s failed to close: %s", w.name, type(exc).__name__)
            held = self.recorded - w.queued - w.failed  # nothing it took is known to be stored
        with self._cond:
            return w.queued + w.failed + held
