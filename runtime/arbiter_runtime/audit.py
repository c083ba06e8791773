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
import re
import secrets
import sys
import threading
import uuid
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
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
    def from_env(cls, env: dict[str, str] | None = None) -> "S3Settings | None":
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
        self.object_lock = False
        self.uploaded_objects: list[str] = []
        self.failures = 0

    async def start(self) -> None:
        self.object_lock = await asyncio.to_thread(self._probe_object_lock)
        self._task = asyncio.create_task(self._loop(), name="audit-s3")

    def _probe_object_lock(self) -> bool:
        try:
            conf = self._client.get_object_lock_configuration(Bucket=self.s.bucket)
        except Exception as exc:  # ObjectLockConfigurationNotFoundError and the like: no object lock
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            log.info("audit bucket %s has no object lock (%s); records are written without retention",
                     self.s.bucket, code)
            return False
        enabled = conf.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"
        log.info("audit bucket %s object lock: %s", self.s.bucket, "enabled" if enabled else "off")
        return enabled

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
            except asyncio.TimeoutError:
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
            now = dt.datetime.now(dt.timezone.utc)
            key = (f"{self.s.prefix}/{self._model}/{self._version}/{now:%Y/%m/%d}/"
                   f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}.jsonl")
            args: dict[str, Any] = {"Bucket": self.s.bucket, "Key": key, "Body": ("\n".join(batch) + "\n").encode(),
                                    "ContentType": "application/x-ndjson"}
            if self.object_lock and self.s.retention_days > 0:
                args["ObjectLockMode"] = self.s.lock_mode
                args["ObjectLockRetainUntilDate"] = now + dt.timedelta(days=self.s.retention_days)
            try:
                self._client.put_object(**args)
            except Exception as exc:
                self.failures += 1
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
    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks

    def record(self, record: dict[str, Any]) -> None:
        line = dumps(record)
        for sink in self.sinks:
            sink.write(line)

    async def close(self) -> None:
        for sink in self.sinks:
            await sink.close()
