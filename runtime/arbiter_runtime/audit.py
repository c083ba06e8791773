"""Audit records: one structured JSON record per decision, to stdout and optionally to S3 in batches.

The record carries the input's sha256 digest, never the input itself (inputs are business data; the digest
proves which input was decided without copying it into logs). stdout gets every record at once, one line each,
flushed, so the cluster's log pipeline holds it even if the process dies a moment later. S3 gets the same lines
in batches (newline-delimited JSON objects), with object-lock retention where the bucket has object lock on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import queue
import re
import secrets
import sys
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from .jsonutil import dumps

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


class Sink(Protocol):
    def write(self, line: str) -> None: ...

    async def close(self) -> None: ...


class StdoutSink:
    def __init__(self, stream: TextIO | None = None):
        self._stream = stream

    def write(self, line: str) -> None:
        stream = self._stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()

    async def close(self) -> None:
        (self._stream or sys.stdout).flush()


@dataclass(frozen=True)
class S3Settings:
    bucket: str
    prefix: str = "audit"
    endpoint_url: str | None = None
    region: str | None = None
    batch_records: int = 500
    interval_s: float = 5.0
    retention_days: int = 0  # 0: use the bucket's default retention (if any)
    lock_mode: str = "COMPLIANCE"
    max_buffered: int = 100_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings | None:
        env = os.environ if env is None else env
        bucket = env.get("ARBITER_AUDIT_S3_BUCKET")
        if not bucket:
            return None
        mode = env.get("ARBITER_AUDIT_S3_LOCK_MODE", "COMPLIANCE").upper()
        if mode not in ("COMPLIANCE", "GOVERNANCE"):
            raise ValueError("ARBITER_AUDIT_S3_LOCK_MODE must be COMPLIANCE or GOVERNANCE")
        return cls(bucket=bucket, prefix=env.get("ARBITER_AUDIT_S3_PREFIX", "audit").strip("/"),
                   endpoint_url=env.get("ARBITER_AUDIT_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None,
                   region=env.get("ARBITER_AUDIT_S3_REGION") or env.get("AWS_REGION") or None,
                   batch_records=int(env.get("ARBITER_AUDIT_S3_BATCH_RECORDS", "500")),
                   interval_s=float(env.get("ARBITER_AUDIT_S3_INTERVAL_S", "5")),
                   retention_days=int(env.get("ARBITER_AUDIT_S3_RETENTION_DAYS", "0")),
                   lock_mode=mode)


UNRETAINED_SUFFIX = "-unretained"


class S3BatchSink:
    """Buffers lines and uploads them as one object per batch, from a worker thread (boto3 blocks).

    Uploads happen when `batch_records` lines are waiting or every `interval_s`; a failed upload keeps the
    lines and is tried again on the next round. `close()` uploads what is left (clean shutdown).
    """

    def __init__(self, settings: S3Settings, model: str, version: str, client: Any = None):
        import boto3

        self.s = settings
        self._client = client or boto3.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region)
        self._model, self._version = model, version
        self._buffer: list[str] = []
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.retention: str | None = None  # locked | unlocked | None: not known (S3 did not answer)
        self._retention_why = ""
        self.uploaded_objects: list[str] = []
        self.failures = 0

    async def start(self) -> None:
        await asyncio.to_thread(self._check_retention)
        self._task = asyncio.create_task(self._loop(), name="audit-s3")

    @property
    def object_lock(self) -> bool:
        return self.retention == "locked"

    def _check_retention(self) -> None:
        """Ask the bucket whether what we write will be retained: locked | unlocked | None (could not tell).

        Asked before the first upload and again after any S3 error: an outage at start-up, or a bucket replaced
        while the pod runs, must not mean records written without retention by mistake.
        """
        try:
            conf = self._client.get_object_lock_configuration(Bucket=self.s.bucket)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            if code in ("ObjectLockConfigurationNotFoundError", "ObjectLockConfigurationNotFound") and \
                    self._bucket_exists():
                self._set_retention("unlocked", f"bucket {self.s.bucket} has no object lock")
            else:
                self.failures += 1
                self._set_retention(None, f"cannot read the object-lock configuration of {self.s.bucket} ({code})")
            return
        lock = conf.get("ObjectLockConfiguration", {})
        if lock.get("ObjectLockEnabled") != "Enabled":
            self._set_retention("unlocked", f"bucket {self.s.bucket} has object lock off")
        elif self.s.retention_days <= 0 and not lock.get("Rule", {}).get("DefaultRetention"):
            self._set_retention("unlocked", f"bucket {self.s.bucket} has object lock but no default retention and "
                                            "ARBITER_AUDIT_S3_RETENTION_DAYS is 0")
        else:
            self._set_retention("locked", f"bucket {self.s.bucket} object lock on")

    def _bucket_exists(self) -> bool:
        # Some S3 servers answer "no object-lock configuration" for a bucket that does not exist at all.
        try:
            self._client.head_bucket(Bucket=self.s.bucket)
            return True
        except Exception:
            return False

    def _set_retention(self, state: str | None, why: str) -> None:
        if state != self.retention or self._retention_why != why:
            level = logging.INFO if state == "locked" else logging.WARNING if state is None else logging.ERROR
            where = {"locked": f"s3://{self.s.bucket}/{self.s.prefix}/",
                     "unlocked": f"s3://{self.s.bucket}/{self.s.prefix}{UNRETAINED_SUFFIX}/ (records WITHOUT "
                                 "retention)",
                     None: "nowhere yet: records wait in memory and the check is repeated"}[state]
            log.log(level, "audit retention: %s; writing to %s", why, where)
        self.retention, self._retention_why = state, why

    def write(self, line: str) -> None:
        with self._lock:
            self._buffer.append(line)
            if len(self._buffer) > self.s.max_buffered:
                # S3 is unreachable for long: keep memory bounded; these records are still on stdout.
                dropped = len(self._buffer) - self.s.max_buffered
                del self._buffer[:dropped]
                log.error("audit S3 buffer full: %d oldest records dropped from the S3 batch (they are on stdout)",
                          dropped)
            full = len(self._buffer) >= self.s.batch_records
        if full:
            self._wake.set()

    async def _loop(self) -> None:
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.s.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            await asyncio.to_thread(self.flush)

    def flush(self) -> int:
        """Upload everything buffered now; returns the number of records uploaded."""
        with self._upload_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
            if not batch:
                return 0
            if self.retention is None:
                self._check_retention()
            if self.retention is None:  # S3 unknown: the records wait (they are on stdout meanwhile)
                with self._lock:
                    self._buffer[:0] = batch
                return 0
            now = dt.datetime.now(dt.UTC)
            # Without retention the records go under a prefix that says so, never among the retained ones.
            prefix = self.s.prefix if self.retention == "locked" else self.s.prefix + UNRETAINED_SUFFIX
            key = (f"{prefix}/{self._model}/{self._version}/{now:%Y/%m/%d}/"
                   f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}.jsonl")
            args: dict[str, Any] = {"Bucket": self.s.bucket, "Key": key, "Body": ("\n".join(batch) + "\n").encode(),
                                    "ContentType": "application/x-ndjson"}
            if self.retention == "locked" and self.s.retention_days > 0:
                args["ObjectLockMode"] = self.s.lock_mode
                args["ObjectLockRetainUntilDate"] = now + dt.timedelta(days=self.s.retention_days)
            try:
                self._client.put_object(**args)
            except Exception as exc:
                self.failures += 1
                self.retention = None  # re-check before the next upload: the bucket may have changed
                with self._lock:
                    self._buffer[:0] = batch  # keep order; retried on the next round
                code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
                log.error("audit upload to s3://%s/%s failed (%s); %d records kept for the next try",
                          self.s.bucket, key, code, len(batch))
                return 0
            self.uploaded_objects.append(key)
            return len(batch)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await asyncio.to_thread(self.flush)


class AuditLog:
    """Hands records to the sinks from one writer thread, so a slow or stalled sink never blocks a request.

    The queue is bounded by reservation: a request reserves one slot per row *before* it is decided
    (`reserve`), so a decision that leaves the server always has room for its record; when the slots are used up
    (a sink is stalled) new requests are refused with 503 rather than decided without a record. `depth` is what
    is reserved or waiting (arbiter_audit_queue_depth).
    """

    def __init__(self, sinks: list[Sink], capacity: int = 10_000, on_write_error: Any = None):
        self.sinks = sinks
        self.capacity = capacity
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._held = 0  # reserved + queued, not yet written
        self._queued = 0
        self._cond = threading.Condition()
        self._on_write_error = on_write_error
        self.written = 0
        self.write_errors = 0
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._held

    def reserve(self, n: int, limit: int | None = None) -> bool:
        """Hold n slots, unless that would take the queue past `limit` (default: the capacity)."""
        with self._cond:
            if self._held + n > (self.capacity if limit is None else min(limit, self.capacity)):
                return False
            self._held += n
            return True

    def release(self, n: int) -> None:
        """Give back slots reserved for rows that will not be recorded (they did not leave the server)."""
        if n:
            with self._cond:
                self._held -= n
                self._cond.notify_all()

    def record(self, record: dict[str, Any], reserved: bool = True) -> None:
        line = dumps(record)
        with self._cond:
            if not reserved:
                self._held += 1
            self._queued += 1
        self._queue.put(line)

    def _run(self) -> None:
        while True:
            line = self._queue.get()
            if line is None:
                return
            for sink in self.sinks:
                try:
                    sink.write(line)
                except Exception as exc:  # a closed stdout, a sink bug: keep writing to the others
                    self.write_errors += 1
                    log.error("audit sink %s failed: %s", type(sink).__name__, type(exc).__name__)
                    if self._on_write_error is not None:
                        self._on_write_error(type(sink).__name__)
            with self._cond:
                self._held -= 1
                self._queued -= 1
                self.written += 1
                self._cond.notify_all()

    def wait_written(self, timeout: float = 10.0) -> bool:
        """Block until every queued record is written (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    async def close(self, timeout: float = 20.0) -> None:
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            log.error("audit writer still blocked after %.0f s: %d records not written", timeout, self._queued)
        for sink in self.sinks:
            await sink.close()
