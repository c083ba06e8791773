"""What an S3 read is configured with and how it fails: the credentials in KServe's storage-config form (or an AWS-style
Secret, as OpenShift AI's data connections hold them), picked from a Secret with the DecisionModel's overrides
applied, and the errors every S3 read raises. No credential ever reaches an error message or a repr."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .s3_identity import OwnCredentials


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
    # An entry without keys, read with the operator's own AWS credentials (botocore's chain: web identity, instance
    # metadata, ...), as KServe's storage initializer reads it with its pod's.
    own: OwnCredentials | None = field(repr=False, default=None)


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


def _storage_entry(secret_text: dict[str, str], secret_name: str, bucket: str,
                   key: str | None) -> tuple[dict[str, Any], str | None]:
    """The storage-config entry to read with, and its key (None: an AWS-style Secret)."""
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
    return entry, chosen


def credentials_from_secret(
    secret_text: dict[str, str],
    *,
    secret_name: str,
    bucket: str,
    key: str | None = None,
    endpoint: str | None = None,
    region: str | None = None,
    ca_bundle_pem: str | None = None,
    own: OwnCredentials | None = None,
) -> S3Credentials:
    """Pick the storage-config entry (`key`, else the one named after the bucket, else `default`) and apply overrides.

    Also accepts a plain AWS-style Secret (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_S3_ENDPOINT /
    AWS_DEFAULT_REGION), the form OpenShift AI data connections use.

    An entry with neither key is read with `own`, the operator's own AWS credentials, when the operator was installed
    with them (None: refused, saying how to turn them on).
    """
    entry, chosen = _storage_entry(secret_text, secret_name, bucket, key)
    anonymous = _truthy(entry.get("anonymous"), False)
    has_id, has_secret = bool(entry.get("access_key_id")), bool(entry.get("secret_access_key"))
    if not anonymous and has_id != has_secret:
        raise CredentialsInvalid(f"Secret {secret_name} has only one of access_key_id/secret_access_key for bucket "
                                 f"{bucket}; give both, or neither to read with the operator's own AWS credentials")
    if not anonymous and not has_id and own is None:
        raise CredentialsInvalid(
            f"Secret {secret_name} has no access_key_id/secret_access_key for bucket {bucket}, and the operator is not "
            "installed to read with its own AWS credentials (Helm value aws.ownCredentials, flag "
            "--s3-own-credentials; docs/security.md)"
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
        own=own if not anonymous and not has_id else None,
    )
