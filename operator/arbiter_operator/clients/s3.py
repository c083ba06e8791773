"""S3 reads for the artifact checks (boto3), with credentials in KServe's storage-config form.

KServe's `storage-config` Secret holds one JSON document per key, e.g.
  {"type": "s3", "access_key_id": "...", "secret_access_key": "...", "endpoint_url": "https://minio:9000",
   "region": "us-east-1", "verify_ssl": "1", "bucket": "models"}
`credentials_from_secret` picks an entry and applies the DecisionModel's overrides (endpoint, region, CA bundle).

boto3 is synchronous: every call runs in a worker thread (`asyncio.to_thread`) so kopf's event loop never blocks.
Credentials never reach a log, an event, a status or an exception message: `S3Credentials.__repr__` hides them and
errors carry only the S3 error code, bucket and key.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

MAX_LISTING = 10000  # a model directory has tens of files; past this the prefix is wrong
MAX_CONFIG_BYTES = 4 * 1024 * 1024


class StorageError(Exception):
    """Base class; never carries a credential."""


class StorageUnreachable(StorageError):
    """Network, TLS, timeouts, 5xx: retry later."""


class StorageRejected(StorageError):
    """S3 answered with an error that a retry will not fix (access denied, no such bucket, bad key)."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class CredentialsInvalid(StorageError):
    """The Secret entry is missing or not in storage-config form."""


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str = field(repr=False, default="")
    secret_access_key: str = field(repr=False, default="")
    endpoint_url: str | None = None
    region: str | None = None
    verify_ssl: bool = True
    ca_bundle_pem: str | None = field(repr=False, default=None)
    anonymous: bool = False
    default_bucket: str | None = None
    # The storage-config entry these came from (None: an AWS-style Secret): KServe's storage initializer is told to
    # read the same one, so the pod loads with what the artifact check was allowed to read.
    entry_key: str | None = None


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the listed prefix
    size: int
    etag: str


def _truthy(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def decode_secret_data(data: dict[str, str] | None) -> dict[str, str]:
    """A Secret's `.data` (base64) as text."""
    out = {}
    for k, v in (data or {}).items():
        try:
            out[k] = base64.b64decode(v).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsInvalid(f"Secret key {k!r} is not valid base64 text") from None
    return out


def credentials_from_secret(
    secret_text: dict[str, str],
    *,
    secret_name: str,
    bucket: str,
    key: str | None = None,
    endpoint: str | None = None,
    region: str | None = None,
    ca_bundle_pem: str | None = None,
) -> S3Credentials:
    """Pick the storage-config entry (`key`, else the one named after the bucket, else `default`) and apply overrides.

    Also accepts a plain AWS-style Secret (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_S3_ENDPOINT /
    AWS_DEFAULT_REGION), the form OpenShift AI data connections use.
    """
    chosen: str | None = None
    if "AWS_ACCESS_KEY_ID" in secret_text and key is None:
        entry: dict[str, Any] = {
            "type": "s3",
            "access_key_id": secret_text.get("AWS_ACCESS_KEY_ID", ""),
            "secret_access_key": secret_text.get("AWS_SECRET_ACCESS_KEY", ""),
            "endpoint_url": secret_text.get("AWS_S3_ENDPOINT"),
            "region": secret_text.get("AWS_DEFAULT_REGION"),
            "bucket": secret_text.get("AWS_S3_BUCKET"),
        }
    else:
        candidates = [key] if key else [bucket, "default"]
        chosen = next((c for c in candidates if c in secret_text), None)
        if chosen is None:
            have = ", ".join(sorted(secret_text)) or "none"
            raise CredentialsInvalid(
                f"Secret {secret_name} has no entry {' or '.join(repr(c) for c in candidates)} (entries: {have}); "
                "set spec.storage.key to one of them"
            )
        try:
            entry = json.loads(secret_text[chosen])
        except ValueError:
            raise CredentialsInvalid(
                f"Secret {secret_name} entry {chosen!r} is not JSON in KServe's storage-config form"
            ) from None
        if not isinstance(entry, dict) or entry.get("type", "s3") != "s3":
            raise CredentialsInvalid(f"Secret {secret_name} entry {chosen!r} is not of type s3")
    anonymous = _truthy(entry.get("anonymous"), False)
    if not anonymous and not (entry.get("access_key_id") and entry.get("secret_access_key")):
        raise CredentialsInvalid(
            f"Secret {secret_name} has no access_key_id/secret_access_key for bucket {bucket}"
        )
    endpoint_url = endpoint or entry.get("endpoint_url") or None
    if endpoint_url and "://" not in endpoint_url:
        # KServe accepts a bare host:port and decides the scheme from `verify_ssl`/`use_https`.
        https = _truthy(entry.get("use_https"), _truthy(entry.get("verify_ssl"), True))
        endpoint_url = ("https://" if https else "http://") + endpoint_url
    return S3Credentials(
        access_key_id=entry.get("access_key_id", ""),
        secret_access_key=entry.get("secret_access_key", ""),
        endpoint_url=endpoint_url,
        region=region or entry.get("region") or None,
        verify_ssl=_truthy(entry.get("verify_ssl"), True),
        ca_bundle_pem=ca_bundle_pem or entry.get("ca_bundle") or None,
        anonymous=anonymous,
        default_bucket=entry.get("bucket"),
        entry_key=chosen,
    )


_UNREACHABLE_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "503", "500", "502", "504"}


_SESSION: boto3.session.Session | None = None
_SESSION_LOCK = threading.Lock()


class S3Storage:
    """Read-only S3 access for the artifact check. One instance per credentials; `close()` when done."""

    def __init__(self, creds: S3Credentials, *, connect_timeout: float = 5, read_timeout: float = 15):
        self._creds = creds
        self.entry_key = creds.entry_key
        self._ca_file: str | None = None
        self._config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": 2, "mode": "standard"},
            # MinIO and most on-prem endpoints only serve path-style URLs.
            s3={"addressing_style": "path" if creds.endpoint_url else "auto"},
            signature_version=botocore.UNSIGNED if creds.anonymous else "s3v4",
        )
        self._client = None

    def _make_client(self):
        if self._client is not None:
            return self._client
        verify: bool | str = self._creds.verify_ssl
        if self._creds.verify_ssl and self._creds.ca_bundle_pem:
            pem = self._creds.ca_bundle_pem
            if os.path.exists(pem):
                verify = pem
            else:
                fd, path = tempfile.mkstemp(prefix="arbiter-s3-ca-", suffix=".pem")
                with os.fdopen(fd, "w") as f:
                    f.write(pem)
                self._ca_file = verify = path
        # One botocore session for the process: a new one parses botocore's service models again, which was 59% of
        # the operator's CPU in the scale benchmark (155 ms per client against 9 ms from a shared session). Creating
        # clients from one session is not thread-safe, hence the lock; the clients themselves are.
        with _SESSION_LOCK:
            global _SESSION
            if _SESSION is None:
                _SESSION = boto3.session.Session()
            self._client = _SESSION.client(
                "s3",
                endpoint_url=self._creds.endpoint_url,
                region_name=self._creds.region or "us-east-1",
                aws_access_key_id=self._creds.access_key_id or None,
                aws_secret_access_key=self._creds.secret_access_key or None,
                verify=verify,
                config=self._config,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._ca_file:
            os.unlink(self._ca_file)
            self._ca_file = None

    async def __aenter__(self) -> "S3Storage":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # The blocking parts, run in a thread.
    def _list_sync(self, bucket: str, prefix: str, limit: int) -> list[ObjectInfo]:
        client = self._make_client()
        base = prefix.rstrip("/") + "/" if prefix else ""
        out: list[ObjectInfo] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []) or []:
                key = obj["Key"][len(base):]
                out.append(ObjectInfo(key=key, size=int(obj.get("Size", 0)), etag=obj.get("ETag", "").strip('"')))
                if len(out) >= limit:
                    return out
        return out

    def _get_sync(self, bucket: str, key: str, max_bytes: int) -> bytes | None:
        client = self._make_client()
        try:
            resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{max_bytes - 1}")
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        with resp["Body"] as body:
            return body.read()

    async def _run(self, what: str, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except botocore.exceptions.ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", "Unknown"))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _UNREACHABLE_CODES or status >= 500:
                raise StorageUnreachable(f"S3 answered {code} to {what}; retrying") from None
            raise StorageRejected(code, f"S3 answered {code} to {what}") from None
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                botocore.exceptions.ReadTimeoutError, botocore.exceptions.SSLError,
                botocore.exceptions.ConnectionClosedError, botocore.exceptions.HTTPClientError) as exc:
            raise StorageUnreachable(
                f"cannot reach S3 at {self._creds.endpoint_url or 'AWS'} for {what} ({type(exc).__name__})"
            ) from None
        except botocore.exceptions.NoCredentialsError:
            raise StorageRejected("NoCredentials", f"no S3 credentials for {what}") from None

    async def list_objects(self, bucket: str, prefix: str, limit: int = MAX_LISTING) -> list[ObjectInfo]:
        return await self._run(f"listing s3://{bucket}/{prefix}", self._list_sync, bucket, prefix, limit)

    async def get_bytes(self, bucket: str, key: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes | None:
        """The object's first `max_bytes` bytes, or None when it does not exist."""
        return await self._run(f"reading s3://{bucket}/{key}", self._get_sync, bucket, key, max_bytes)
