"""The operator's own AWS credentials, for the artifact checks whose storage-config entry carries no keys: botocore's
own provider chain, as boto3 would resolve it (environment keys; a web identity: `AWS_ROLE_ARN` with
`AWS_WEB_IDENTITY_TOKEN_FILE`, the projected ServiceAccount token that IRSA on EKS and ROSA's STS mode give a pod,
exchanged with AssumeRoleWithWebIdentity at `AWS_ENDPOINT_URL_STS` or AWS's STS; shared config and SSO profiles;
container credentials; instance metadata). Temporary credentials are botocore's refreshable ones: they are exchanged
again before they expire, reading the token file afresh each time, so a rotated token is used.

Only on when the operator is installed with it (`--s3-own-credentials`, Helm value `aws.ownCredentials`): otherwise a
DecisionModel in any namespace could have the operator read any bucket the operator's role may read.

What the chain does may block (a token exchange with STS, a metadata request): it runs in a thread of its own, one at
a time, never on the event loop; a check waits for it at most `deadline` seconds. Credentials valid for longer than
botocore's advisory window are handed out without any thread. Failures come back as the S3 client's errors, with a
message that names what to fix and no credential: `CredentialsInvalid` (no credentials found, a token STS refuses,
an expired or unreadable token) and `StorageUnreachable` (STS cannot be reached or is failing); both leave the
artifact verdict Unknown, checked again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

from .s3_config import CredentialsInvalid, StorageUnreachable

# Answers of STS (and of the identity provider behind it) that a retry of the same token will not change.
_REFUSED = {"AccessDenied", "ExpiredToken", "ExpiredTokenException", "IDPRejectedClaim", "InvalidIdentityToken",
            "InvalidIdentityTokenException", "InvalidParameterValue", "InvalidClientTokenId", "InvalidAction",
            "MalformedPolicyDocument", "RegionDisabledException", "ValidationError", "AccessDeniedException"}
# Answers a retry may fix, whatever HTTP status carries them (AWS's STS throttles with a 400).
_TRANSIENT = {"Throttling", "ThrottlingException", "IDPCommunicationError", "RequestTimeout", "ServiceUnavailable",
              "InternalError", "InternalFailure", "SlowDown", "TooManyRequests"}
_WEB_IDENTITY_HINT = ("check that AWS_WEB_IDENTITY_TOKEN_FILE holds a current ServiceAccount token with the audience "
                      "the identity provider expects, and that the trust policy of AWS_ROLE_ARN admits the operator's "
                      "ServiceAccount")


def _botocore_chain() -> Any:
    """botocore's default credential chain for this process's environment (None: it found nothing)."""
    import botocore.session

    return botocore.session.Session().get_credentials()


class OwnCredentials:
    """The operator's own credentials, resolved once through `resolve` (botocore's chain) and refreshed by botocore.
    One per process; safe to share between event loops and threads."""

    def __init__(self, resolve: Callable[[], Any] = _botocore_chain, deadline: float = 30.0) -> None:
        self._resolve = resolve
        self.deadline = deadline
        self._source: Any = None  # botocore Credentials (refreshable or not); None until the chain found some
        self._lock = threading.Lock()
        self._inflight: concurrent.futures.Future[Any] | None = None

    def __repr__(self) -> str:
        return "OwnCredentials()"

    async def frozen(self) -> Any:
        """Credentials to sign one request with (botocore's ReadOnlyCredentials: key, secret, session token)."""
        source = self._source
        if source is not None and not _refresh_needed(source):
            return source.get_frozen_credentials()  # within their validity: no I/O
        future = self._start()
        try:
            async with asyncio.timeout(self.deadline):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            raise StorageUnreachable(f"the operator's AWS credentials: no answer from {_where()} within "
                                     f"{self.deadline:g} s; retrying") from None

    def _start(self) -> concurrent.futures.Future[Any]:
        """The fetch in flight, or a new one in a thread of its own (one at a time: a fleet's checks share it)."""
        with self._lock:
            if self._inflight is not None and not self._inflight.done():
                return self._inflight
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # running: a waiter's cancellation cannot cancel it for the others
            self._inflight = future
        threading.Thread(target=self._fetch, args=(future,), name="aws-credentials", daemon=True).start()
        return future

    def _fetch(self, future: concurrent.futures.Future[Any]) -> None:
        try:
            source = self._source
            if source is None:
                source = self._resolve()
                if source is None:
                    raise CredentialsInvalid(
                        "the operator has no AWS credentials of its own (botocore's chain found no environment keys, "
                        "no web identity token, no profile, no container or instance credentials); put keys in the "
                        "storage-config entry, or give the operator an identity (docs/security.md)")
                self._source = source
            frozen = source.get_frozen_credentials()
            if not frozen.access_key or not frozen.secret_key:
                raise CredentialsInvalid(f"the operator's AWS credentials ({_method(source)}) are incomplete")
        except BaseException as exc:  # the thread must always settle the future its waiters hold
            future.set_exception(_explained(exc, self._source))
        else:
            future.set_result(frozen)


def _refresh_needed(source: Any) -> bool:
    """Whether handing out `source` now may do I/O (botocore refreshes in its advisory window, or has none yet)."""
    needed = getattr(source, "refresh_needed", None)
    return bool(needed()) if callable(needed) else False


def _method(source: Any) -> str:
    return str(getattr(source, "method", None) or "unknown source")


def _where() -> str:
    return "STS" if os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE") else "the credential source"


def _explained(exc: BaseException, source: Any) -> BaseException:
    """The S3 client's error for a failure of the chain: what failed and what to check, never a credential."""
    if isinstance(exc, (CredentialsInvalid, StorageUnreachable)):
        return exc
    from botocore import exceptions as bce

    how = _method(source) if source is not None else "botocore's credential chain"
    web = how == "assume-role-with-web-identity"
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(error.get("Code") or "error")[:64]
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") if isinstance(
            exc.response, dict) else None
        if code not in _TRANSIENT and (code in _REFUSED or (isinstance(status, int) and 400 <= status < 500
                                                             and status != 429)):
            hint = _WEB_IDENTITY_HINT if web else "check the operator's AWS identity"
            return CredentialsInvalid(f"the operator's AWS credentials ({how}): {_sts_verb(web)} refused ({code}); "
                                      f"{hint}")
        return StorageUnreachable(f"the operator's AWS credentials ({how}): {_sts_verb(web)} answered {code}; "
                                  "retrying")
    if isinstance(exc, (bce.HTTPClientError, bce.ConnectionError)):
        return StorageUnreachable(f"the operator's AWS credentials ({how}): cannot reach {_where()} "
                                  f"({type(exc).__name__}); retrying")
    if isinstance(exc, OSError):  # the token file: missing (not mounted yet) or unreadable
        return CredentialsInvalid(f"the operator's AWS credentials ({how}): cannot read AWS_WEB_IDENTITY_TOKEN_FILE "
                                  f"({type(exc).__name__}); check the projected ServiceAccount token's volume")
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError, bce.CredentialRetrievalError,
                        bce.InvalidConfigError, RuntimeError)):
        # botocore's own messages name the provider and what is missing, never a secret.
        return CredentialsInvalid(f"the operator's AWS credentials ({how}): {str(exc)[:300]}")
    return StorageUnreachable(f"the operator's AWS credentials ({how}): {type(exc).__name__}; retrying")


def _sts_verb(web: bool) -> str:
    return "STS's AssumeRoleWithWebIdentity" if web else "the credential source"
