"""The S3 audit sink: the stdout lines again, in batches (newline-delimited JSON objects), each record exactly once.

Exactly once under S3 faults: a batch is sealed when it is cut from the buffer: its object key (time + random id)
and its bytes never change again, so every retry PUTs the same object. An upload S3 stored but did not acknowledge
(a 500 or a reset after the write) is retried under the same key: one object, the same lines (with versioning or
object lock the retry may add a version of that key, never a second key; readers count lines per key). After any
failed PUT the next attempt first asks S3 (HEAD) whether the object is already there, and does not PUT it again if
it is. No conditional PUT (If-None-Match): not every S3-compatible server honours it, and one that ignores it gains
nothing while one that refuses it would never take a record.

Shutdown (`close(deadline)`): the uploader keeps retrying, with backoff, until every batch is confirmed or the
deadline passes; what is left is reported as not written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("arbiter.audit")

UNRETAINED_SUFFIX = "-unretained"
_BACKOFF_S = (0.2, 2.0)  # first and longest pause between shutdown retries


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


_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "InvalidConfigError", "FileNotFoundError", "PermissionError")


def _code(exc: Exception) -> str:
    """What failed, in a few words for the log. A failure of the pod's credentials (botocore's chain: a web identity
    STS refuses, a token file missing) says so, and never reads as the bucket's answer: an STS AccessDenied is not a
    bucket refusing HEAD."""
    # A connection reset is a botocore error whose `response` is None, not absent.
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", type(exc).__name__))
    operation = getattr(exc, "operation_name", "")
    if operation.startswith("AssumeRole"):
        return f"credentials: STS {operation} answered {code}"
    if code in _CREDENTIAL_ERRORS:
        return f"credentials: {code} (check AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, or the pod's keys)"
    return code


@dataclass
class _Batch:
    """Lines sealed into one object: `tail` (date/time-id.jsonl) and `body` are fixed; the prefix follows the
    retention the object is written with."""

    tail: str
    body: bytes
    records: int
    cut_at: dt.datetime
    retention: str  # locked | unlocked
    key: str = ""
    tried: bool = False  # a PUT failed: S3 may hold the object all the same


class S3BatchSink:
    """Buffers lines and uploads them as one object per batch, from its own uploader thread (boto3 blocks).

    Uploads happen when `batch_records` lines are waiting or every `interval_s`; a failed upload keeps its batch
    (key and bytes) and is tried again on the next round. `close(deadline)` uploads what is left, retrying until
    the deadline.
    """

    name = "s3"

    def __init__(self, settings: S3Settings, model: str, version: str, client: Any = None):
        self.s = settings
        self._client = client or self._new_client(settings)
        self._model, self._version = model, version
        self._buffer: list[str] = []
        self._pending: list[_Batch] = []  # sealed, oldest first; only the uploader changes it
        self._waiting = 0  # records in _buffer and _pending (under _lock)
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = 0.0
        self._thread: threading.Thread | None = None
        self.retention: str | None = None  # locked | unlocked | None: not known (S3 did not answer)
        self._announced: tuple[str | None, str] | None = None  # the retention last logged, and why
        self.uploaded_objects: list[str] = []
        self.failures = 0
        self.dropped = 0  # records never added to a batch (the buffer was full)
        self._last_error = ""
        self._may_head = True  # False once the bucket refuses HEAD (a put-only role)

    @staticmethod
    def _new_client(settings: S3Settings) -> Any:
        import boto3
        from botocore.config import Config

        # Credentials from boto3's chain: environment keys, a web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE,
        # the projected ServiceAccount token the operator renders or IRSA injects; exchanged at AWS_ENDPOINT_URL_STS
        # or AWS's STS and refreshed before they expire, re-reading the rotated token), container or instance metadata.
        # Bounded calls: the shutdown retries until its deadline, and one call must not outlast it by minutes.
        return boto3.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region,
                            config=Config(connect_timeout=5, read_timeout=15,
                                          retries={"mode": "standard", "max_attempts": 3}))

    async def start(self) -> None:
        await asyncio.to_thread(self._check_retention)
        # A daemon thread, not the event loop's executor: a call still hanging at the deadline must not hold the
        # process past it (the executor's threads are joined at exit).
        self._thread = threading.Thread(target=self._run, name="audit-s3", daemon=True)
        self._thread.start()

    @property
    def object_lock(self) -> bool:
        return self.retention == "locked"

    @property
    def waiting(self) -> int:
        """Records taken and not yet confirmed by S3."""
        with self._lock:
            return self._waiting

    def _check_retention(self) -> None:
        """Ask the bucket whether what we write will be retained: locked | unlocked | None (could not tell).

        Asked before the first upload and again after any S3 error: an outage at start-up, or a bucket replaced
        while the pod runs, must not mean records written without retention by mistake.
        """
        try:
            conf = self._client.get_object_lock_configuration(Bucket=self.s.bucket)
        except Exception as exc:
            code = _code(exc)
            if code in ("ObjectLockConfigurationNotFoundError", "ObjectLockConfigurationNotFound") and \
                    self._bucket_exists():
                self._set_retention("unlocked", f"bucket {self.s.bucket} has no object lock")
            else:
                self.failures += 1
                self._last_error = code
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
        # Logged when it changes, not at every re-check after an S3 error that left the bucket as it was.
        if (state, why) != self._announced:
            level = logging.INFO if state == "locked" else logging.WARNING if state is None else logging.ERROR
            where = {"locked": f"s3://{self.s.bucket}/{self.s.prefix}/",
                     "unlocked": f"s3://{self.s.bucket}/{self.s.prefix}{UNRETAINED_SUFFIX}/ (records WITHOUT "
                                 "retention)",
                     None: "nowhere yet: records wait in memory and the check is repeated"}[state]
            log.log(level, "audit retention: %s; writing to %s", why, where)
        self.retention, self._announced = state, (state, why)

    def write(self, line: str) -> None:
        with self._lock:
            if self._waiting >= self.s.max_buffered:
                # S3 unreachable for long: memory stays bounded; the record is on stdout, not in the S3 copy.
                if not self.dropped % 10_000:
                    log.error("audit S3 buffer full (%d records waiting): records are not added to the S3 copy "
                              "(%d so far; they are on stdout)", self._waiting, self.dropped + 1)
                self.dropped += 1
                return
            self._buffer.append(line)
            self._waiting += 1
            # Once per batch's worth: a failing S3 is asked again per batch, not per record.
            full = len(self._buffer) == self.s.batch_records
        if full:
            self._wake.set()

    def _run(self) -> None:
        while not self._closing.is_set():
            self._wake.wait(self.s.interval_s)
            self._wake.clear()
            if not self._closing.is_set():
                self.flush()
        self._drain()

    def _drain(self) -> None:
        """Shutdown: upload what is left, retrying with backoff until all of it is confirmed or the deadline."""
        pause = _BACKOFF_S[0]
        while True:
            self.flush()
            left = self._deadline - time.monotonic()
            if not self.waiting or left <= 0:
                return
            time.sleep(min(left, pause * random.uniform(0.5, 1.0)))
            pause = min(pause * 2, _BACKOFF_S[1])

    def _seal(self, lines: list[str], now: dt.datetime) -> _Batch:
        assert self.retention is not None
        tail = (f"{self._model}/{self._version}/{now:%Y/%m/%d}/"
                f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}.jsonl")
        return self._key(_Batch(tail, ("\n".join(lines) + "\n").encode(), len(lines), now, self.retention))

    def _key(self, batch: _Batch) -> _Batch:
        # Without retention the records go under a prefix that says so, never among the retained ones.
        prefix = self.s.prefix if batch.retention == "locked" else self.s.prefix + UNRETAINED_SUFFIX
        batch.key = f"{prefix}/{batch.tail}"
        return batch

    def _cut(self) -> None:
        with self._lock:
            lines, self._buffer = self._buffer, []
        now = dt.datetime.now(dt.UTC)
        for i in range(0, len(lines), self.s.batch_records):
            self._pending.append(self._seal(lines[i:i + self.s.batch_records], now))

    def _stored(self, batch: _Batch) -> bool | None:
        """Whether S3 holds the batch's object (after a failed PUT it may: the acknowledgement can be lost);
        None: S3 will not say."""
        if not self._may_head:
            return None
        try:
            head = self._client.head_object(Bucket=self.s.bucket, Key=batch.key)
        except Exception as exc:
            code = _code(exc)
            if code in ("403", "AccessDenied", "Forbidden"):
                # A put-only role: the retry cannot ask, so it PUTs the same key and bytes again (idempotent).
                log.warning("audit: s3://%s refuses HEAD (%s): a failed upload is retried without checking "
                            "first (grant s3:GetObject to avoid a second version of its key)", self.s.bucket, code)
                self._may_head = False
                return None
            if code in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        # Only this process writes under the batch's random id: an object of the batch's size is the batch.
        return int(head.get("ContentLength", -1)) == len(batch.body)

    def _upload(self, batch: _Batch) -> None:
        if batch.tried:
            stored = self._stored(batch)
            if stored:
                return
            if stored is False and batch.retention != self.retention:
                # Never stored under the old key, so it may move: its records follow the bucket's retention now.
                assert self.retention is not None
                batch.retention = self.retention
                self._key(batch)
        args: dict[str, Any] = {"Bucket": self.s.bucket, "Key": batch.key, "Body": batch.body,
                                "ContentType": "application/x-ndjson"}
        if batch.retention == "locked" and self.s.retention_days > 0:
            args["ObjectLockMode"] = self.s.lock_mode
            args["ObjectLockRetainUntilDate"] = batch.cut_at + dt.timedelta(days=self.s.retention_days)
        batch.tried = True
        self._client.put_object(**args)

    def flush(self) -> int:
        """Seal what is buffered and upload every sealed batch, oldest first; returns the records uploaded."""
        with self._upload_lock:
            if self.retention is None:
                self._check_retention()
            if self.retention is None:  # S3 unknown: the records wait (they are on stdout meanwhile)
                return 0
            self._cut()
            done = 0
            while self._pending:
                batch = self._pending[0]
                try:
                    self._upload(batch)
                except Exception as exc:
                    self.failures += 1
                    self._last_error = _code(exc)
                    self.retention = None  # re-check before the next upload: the bucket may have changed
                    log.error("audit upload to s3://%s/%s failed (%s); %d records kept for the next try",
                              self.s.bucket, batch.key, self._last_error, self.waiting)
                    break
                self._pending.pop(0)
                self.uploaded_objects.append(batch.key)
                with self._lock:
                    self._waiting -= batch.records
                done += batch.records
            return done

    async def close(self, deadline: float) -> int:
        """Upload what is left, retrying until `deadline` (time.monotonic()); returns the records not in S3."""
        self._deadline = deadline
        self._closing.set()
        self._wake.set()
        if self._thread is None:  # never started (tests drive flush() themselves): the shutdown rounds only
            self._thread = threading.Thread(target=self._drain, name="audit-s3", daemon=True)
            self._thread.start()
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        with self._lock:
            lost = self._waiting + self.dropped
        if lost:
            log.error("audit S3: %d records not confirmed by s3://%s by the shutdown deadline (%d waiting, last "
                      "error %s; %d never batched, the buffer was full)", lost, self.s.bucket, self._waiting,
                      self._last_error or "none", self.dropped)
        return lost
