"""S3 reads for the artifact checks, with credentials in KServe's storage-config form.

KServe's `storage-config` Secret holds one JSON document per key, e.g.
  {"type": "s3", "access_key_id": "...", "secret_access_key": "...", "endpoint_url": "https://minio:9000",
   "region": "us-east-1", "verify_ssl": "1", "bucket": "models"}
`credentials_from_secret` picks an entry and applies the DecisionModel's overrides (endpoint, region, CA bundle).

The artifact check makes two read-only calls, a bounded ListObjectsV2 and a ranged GetObject, and the audit check
(observe/audit.py) two bucket reads, its versioning and its object-lock configuration, so `S3Storage` speaks them
itself over aiohttp (async: no worker thread; a C HTTP parser, as for the operator's Kubernetes requests), signed
with botocore's own SigV4 signer (`botocore.auth.S3SigV4Auth`, which loads no service model), and reads S3's XML
with `clients.s3_xml` (defusedxml, bounded).

Why not a boto3 client (measured with `benchmarks/s3_client_memory.py`, a fresh process that has imported what the
operator imports anyway, then makes one artifact check's reads against MinIO): boto3 added 20.4 MiB of RSS (5.3
importing it, the rest the S3 service model, endpoints.json and the S3 endpoint rule set its first client loads);
these reads add 4.1 MiB (2.2 importing the signer and defusedxml, 1.9 the first reads). boto3 with a trimmed S3 model
shipped in the package (only ListObjectsV2 and GetObject and their shapes, first on botocore's loader search path)
was measured as the alternative needing less code of our own: 15.1 MiB, and 8.3 MiB with endpoints.json trimmed to
S3 as well; the import and the rule set stay, so it misses a budget of about 5 MiB that this meets. Per check (a
listing and three small reads) both take about 5 ms. Details: docs/benchmarks.md, operator memory.

What stays as with boto3: the credentials (the entry's keys, or for an entry without keys botocore's own provider
chain, refreshable: web identity, instance metadata, ...; `clients.s3_identity`); path-style URLs for any configured
endpoint (MinIO and most on-prem S3), virtual-hosted ones on AWS; the region (a wrong one is corrected once from
S3's `x-amz-bucket-region` answer, as botocore does); TLS verification with certifi's roots (or `AWS_CA_BUNDLE`), a
CA bundle of our own, or none (`verify_ssl: 0`); anonymous access; `HTTPS_PROXY`/`NO_PROXY`; one retry of a
transient failure; connection reuse across the reads of one `S3Storage`. What is stricter: every body is read up to
a bound and no further (a listing page 4 MiB, an error 16 KiB, an object the asked range even when the server
ignores the Range header), the body is never decompressed, a whole request has a deadline (a server trickling bytes
cannot hold a check), redirects are not followed (a signed request never goes to another host), and an answer that
is not S3's XML is `StorageUnreachable`, not a crash.

Credentials never reach a log, an event, a status or an exception message: `S3Credentials.__repr__` hides them and
errors hold only the S3 error code, bucket and key.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import quote, urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import yarl
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .s3_config import (
    CredentialsInvalid,
    S3Credentials,
    StorageError,
    StorageRejected,
    StorageUnreachable,
    credentials_from_secret,
    decode_secret_data,
)
from .s3_identity import OwnCredentials
from .s3_xml import MalformedAnswer, ObjectLock, parse_error_code, parse_listing, parse_object_lock, parse_versioning

# The configuration and errors live in clients/s3_config.py; callers import them from here too.
__all__ = ["CredentialsInvalid", "ObjectInfo", "ObjectLock", "OwnCredentials", "S3Credentials", "S3Storage",
           "StorageError", "StorageRejected", "StorageUnreachable", "credentials_from_secret", "decode_secret_data"]

MAX_LISTING = 10000  # a model directory has tens of files; past this the prefix is wrong
MAX_CONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the listed prefix
    size: int
    etag: str


_UNREACHABLE_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "503", "500", "502", "504",
                      "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequests"}
PAGE_KEYS = 1000  # ListObjectsV2's largest page
MAX_PAGE_BYTES = 4 * 1024 * 1024  # 1,000 keys of up to 1 KiB each, URL-encoded, with their XML
MAX_ERROR_BYTES = 16 * 1024
MAX_TOKEN_CHARS = 4096  # S3's continuation tokens are a few hundred characters
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}")
_VIRTUAL_HOSTABLE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")  # no dots: AWS's wildcard certificate


class _Transient(Exception):
    """A failure one retry may fix (connection, timeout, 5xx, throttling); carries the message for the last one."""


_SSL_CONTEXTS: dict[tuple[bool, str], ssl.SSLContext] = {}
_SSL_LOCK = threading.Lock()


def _ssl_context(verify: bool, ca_bundle: str | None) -> ssl.SSLContext:
    """One TLS context per trust setting for the process: loading certifi's roots costs milliseconds and memory, and
    a DecisionModel's check opens a new S3Storage each time."""
    pem = ca_bundle or ""
    key = (verify, hashlib.sha256(pem.encode()).hexdigest() if verify else "")
    with _SSL_LOCK:
        ctx = _SSL_CONTEXTS.get(key)
        if ctx is not None:
            return ctx
    if not verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif pem:
        # A path (as boto3's `verify` took) or the PEM text itself; it replaces the default roots, as boto3's did.
        try:
            if "-----BEGIN" not in pem and os.path.exists(pem):
                ctx = ssl.create_default_context(cafile=pem)
            else:
                ctx = ssl.create_default_context(cadata=pem)
        except (ssl.SSLError, ValueError, OSError):
            raise _BadCABundle() from None
    else:
        import certifi

        ctx = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or certifi.where())
    with _SSL_LOCK:
        if len(_SSL_CONTEXTS) >= 32:  # CA bundles that rotate: drop the oldest
            _SSL_CONTEXTS.pop(next(iter(_SSL_CONTEXTS)))
        _SSL_CONTEXTS[key] = ctx
    return ctx


class _BadCABundle(Exception):
    pass


def _quote_path(text: str) -> str:
    """S3's canonical URI encoding, once; a "." or ".." segment is escaped so no client or proxy folds it away."""
    return "/".join({".": "%2E", "..": "%2E%2E"}.get(s, quote(s, safe="")) for s in text.split("/"))


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    complete: bool  # False: the server had more than the bound and the rest was not read
    region_hint: str | None


class S3Storage:
    """Read-only S3 access for the artifact check. One instance per credentials; `async with` or `aclose()` when
    done. Its reads reuse one connection pool."""

    def __init__(self, creds: S3Credentials, *, connect_timeout: float = 5, read_timeout: float = 15,
                 max_connections: int | None = 4):
        """max_connections: None for a client that checks share (observe/storage.StoragePool): a check never waits
        for another's connection, as with a client of its own; idle ones are kept 30 s for the next checks."""
        self._max_connections = max_connections
        self._creds = creds
        self.entry_key = creds.entry_key
        self._region = creds.region or "us-east-1"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        # A whole request (connect, answer, body) must end by then: the read timeout alone is per read, and a server
        # sending a byte now and then would hold a check forever.
        self._deadline = connect_timeout + 2 * read_timeout
        self._client: aiohttp.ClientSession | None = None

    @property
    def _where(self) -> str:
        """The endpoint for messages, without any user:password@ it may hold."""
        if not self._creds.endpoint_url:
            return "AWS"
        try:
            parts = urlsplit(self._creds.endpoint_url)
            return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"
        except ValueError:
            return "the configured endpoint"

    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            secure = not (self._creds.endpoint_url or "https:").lower().startswith("http:")
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=_ssl_context(self._creds.verify_ssl if secure else False, self._creds.ca_bundle_pem),
                    limit=self._max_connections or 0, keepalive_timeout=30),
                timeout=self._timeout,
                # Raw bytes only: a compressed body could expand past any bound before it is counted.
                auto_decompress=False,
                headers={"Accept-Encoding": "identity", "User-Agent": "arbiter-operator"},
                # No cookies kept: S3 sets none, and a hostile server could fill a jar.
                cookie_jar=aiohttp.DummyCookieJar(),
                # The proxy comes from HTTPS_PROXY / NO_PROXY (_proxy), as botocore honoured them; aiohttp's
                # trust_env would also send ~/.netrc credentials, which a signed request must not send.
                trust_env=False,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> S3Storage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _url(self, region: str, bucket: str, key: str, query: list[tuple[str, str]]) -> str:
        if self._creds.endpoint_url:
            # Any configured endpoint is addressed path-style: MinIO and most on-prem endpoints serve only that.
            origin = self._creds.endpoint_url.rstrip("/")
            path = "/" + quote(bucket, safe="") + ("/" + _quote_path(key) if key else "")
        else:
            host = f"s3.{region}.amazonaws.com" + (".cn" if region.startswith("cn-") else "")
            if _VIRTUAL_HOSTABLE.fullmatch(bucket):
                origin, path = f"https://{bucket}.{host}", "/" + _quote_path(key)
            else:
                origin, path = f"https://{host}", "/" + quote(bucket, safe="") + ("/" + _quote_path(key) if key else "")
        # Sorted and fully encoded: the URL sent is byte for byte the one signed.
        encoded = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query))
        return origin + path + ("?" + encoded if encoded else "")

    async def _signed_headers(self, url: str, region: str, headers: dict[str, str]) -> dict[str, str]:
        if self._creds.anonymous:
            return headers
        if self._creds.own is not None:
            # The operator's own (botocore's chain): temporary ones carry a session token, signed in as well.
            credentials = await self._creds.own.frozen()
        elif self._creds.access_key_id and self._creds.secret_access_key:
            credentials = Credentials(self._creds.access_key_id, self._creds.secret_access_key)
        else:
            raise StorageRejected("NoCredentials", "no S3 credentials")
        request = AWSRequest(method="GET", url=url, headers=dict(headers), data=b"")
        S3SigV4Auth(credentials, "s3", region).add_auth(request)
        return dict(request.headers.items())

    async def _once(self, region: str, bucket: str, key: str, query: list[tuple[str, str]],
                    headers: dict[str, str], max_body: int, error_body: int) -> _Answer:
        url = self._url(region, bucket, key, query)
        if urlsplit(url).scheme not in ("http", "https"):
            raise StorageRejected("InvalidEndpoint", f"S3 endpoint {self._where!r} is not an http(s) URL")
        signed = await self._signed_headers(url, region, headers)
        client = self._http()
        target = yarl.URL(url, encoded=True)  # sent byte for byte as signed, not quoted again
        async with client.get(target, headers=signed, allow_redirects=False, proxy=_proxy(target)) as response:
            ok = 200 <= response.status < 300
            limit = max_body if ok else error_body
            chunks: list[bytes] = []
            size = 0
            complete = True
            async for chunk in response.content.iter_any():
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    complete = False
                    break
            body = b"".join(chunks)[:limit]
        hint = response.headers.get("x-amz-bucket-region", "").strip()
        return _Answer(response.status, body, complete, hint if _REGION.fullmatch(hint) else None)

    async def _get(self, what: str, bucket: str, key: str, query: list[tuple[str, str]],
                   headers: dict[str, str], max_body: int) -> _Answer:
        """One read with its retry and region correction; an S3 error becomes StorageRejected/StorageUnreachable,
        except 404 and 416, which the caller reads."""
        redirected = False
        attempts = 0
        while True:
            region = self._region
            try:
                try:
                    async with asyncio.timeout(self._deadline):
                        answer = await self._once(region, bucket, key, query, headers, max_body, MAX_ERROR_BYTES)
                except aiohttp.InvalidURL:
                    raise StorageRejected("InvalidEndpoint", f"S3 endpoint {self._where!r} is not a valid URL") \
                        from None
                except aiohttp.ClientError as exc:  # connection, TLS, silence, a malformed or cut answer
                    raise _Transient(f"cannot reach S3 at {self._where} for {what} ({_why(exc)})") from None
                except TimeoutError:  # the request's deadline (after aiohttp's: its timeouts are TimeoutErrors too)
                    raise _Transient(f"cannot reach S3 at {self._where} for {what} (no complete answer within "
                                     f"{self._deadline:g} s)") from None
                except OSError as exc:  # the socket itself
                    raise _Transient(f"cannot reach S3 at {self._where} for {what} ({_why(exc)})") from None
                if 200 <= answer.status < 300 or answer.status in (404, 416):
                    return answer
                code = parse_error_code(answer.body) or str(answer.status)
                if (answer.region_hint and answer.region_hint != region and not redirected
                        and (answer.status in (301, 302, 307) or code == "AuthorizationHeaderMalformed")):
                    # The bucket lives in another region: sign for that one (and, on AWS, ask its endpoint).
                    self._region, redirected = answer.region_hint, True
                    continue
                if code in _UNREACHABLE_CODES or answer.status >= 500 or answer.status == 429:
                    raise _Transient(f"S3 answered {code} to {what}; retrying")
                raise StorageRejected(code, f"S3 answered {code} to {what}")
            except _Transient as exc:
                attempts += 1
                if attempts >= 2:
                    raise StorageUnreachable(str(exc)) from None
                await asyncio.sleep(random.uniform(0.05, 0.5))
            except _BadCABundle:
                raise StorageUnreachable(f"cannot reach S3 at {self._where} for {what}: its CA bundle "
                                         "(spec.storage.caBundleConfigMapRef or the Secret's ca_bundle) is not "
                                         "PEM certificates") from None
            except ValueError:
                raise StorageRejected("InvalidEndpoint", f"S3 endpoint {self._where!r} is not a valid URL for "
                                      f"{what}") from None
            except StorageRejected as exc:
                if exc.code in ("NoCredentials", "InvalidEndpoint"):
                    raise StorageRejected(exc.code, f"{exc} for {what}") from None
                raise

    def _malformed(self, what: str, why: str) -> StorageUnreachable:
        return StorageUnreachable(f"S3 at {self._where} answered {what} with something that is not S3's answer "
                                  f"({why}); retrying")

    async def list_objects(self, bucket: str, prefix: str, limit: int = MAX_LISTING) -> list[ObjectInfo]:
        """The objects under `prefix/` (keys relative to it), at most `limit`."""
        what = f"listing s3://{bucket}/{prefix}"
        base = prefix.rstrip("/") + "/" if prefix else ""
        out: list[ObjectInfo] = []
        token: str | None = None
        seen: set[str] = set()
        while True:
            query = [("list-type", "2"), ("prefix", base), ("encoding-type", "url"),
                     ("max-keys", str(PAGE_KEYS))] + ([("continuation-token", token)] if token else [])
            answer = await self._get(what, bucket, "", query, {}, MAX_PAGE_BYTES)
            if answer.status in (404, 416):
                code = parse_error_code(answer.body) or str(answer.status)
                raise StorageRejected(code, f"S3 answered {code} to {what}")
            if not answer.complete:
                raise self._malformed(what, f"a page over {MAX_PAGE_BYTES // (1024 * 1024)} MiB")
            try:
                page = parse_listing(answer.body, PAGE_KEYS)
            except MalformedAnswer as exc:
                raise self._malformed(what, str(exc)) from None
            for obj in page.objects:
                if not obj.key.startswith(base):
                    continue  # S3 lists only under the prefix; anything else is not ours to count
                out.append(ObjectInfo(key=obj.key[len(base):], size=obj.size, etag=obj.etag))
                if len(out) >= limit:
                    return out
            if not page.truncated or not page.next_token:
                return out
            if len(page.next_token) > MAX_TOKEN_CHARS or page.next_token in seen:
                raise self._malformed(what, "a listing that does not end")
            seen.add(page.next_token)
            token = page.next_token

    async def get_bytes(self, bucket: str, key: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes | None:
        """The object's first `max_bytes` bytes, or None when it does not exist."""
        what = f"reading s3://{bucket}/{key}"
        answer = await self._get(what, bucket, key, [], {"Range": f"bytes=0-{max(max_bytes, 1) - 1}"}, max_bytes)
        if answer.status == 416:
            return b""  # a Range on an empty object: S3 answers InvalidRange
        if answer.status == 404:
            code = parse_error_code(answer.body) or "404"
            if code in ("NoSuchKey", "NotFound", "404"):
                return None
            raise StorageRejected(code, f"S3 answered {code} to {what}")
        return answer.body


    async def _bucket_setting(self, bucket: str, setting: str) -> _Answer:
        """GET ?<setting> of a bucket: the answer (404 included, for the caller), or StorageRejected/Unreachable."""
        what = f"reading the {setting} configuration of s3://{bucket}"
        answer = await self._get(what, bucket, "", [(setting, "")], {}, MAX_ERROR_BYTES)
        if not answer.complete:
            raise self._malformed(what, f"an answer over {MAX_ERROR_BYTES // 1024} KiB")
        if answer.status == 404:
            code = parse_error_code(answer.body) or "404"
            if code in ("NoSuchBucket", "404"):
                raise StorageRejected("NoSuchBucket", f"S3 answered NoSuchBucket to {what}")
        return answer

    async def bucket_versioning(self, bucket: str) -> str:
        """Enabled, Suspended or "" (never enabled); StorageRejected("NoSuchBucket") when there is no such bucket."""
        answer = await self._bucket_setting(bucket, "versioning")
        if answer.status == 404:
            raise StorageRejected(parse_error_code(answer.body) or "404", f"S3 answered 404 to versioning of {bucket}")
        try:
            return parse_versioning(answer.body)
        except MalformedAnswer as exc:
            raise self._malformed(f"the versioning of s3://{bucket}", str(exc)) from None

    async def object_lock(self, bucket: str) -> ObjectLock:
        """The bucket's object-lock configuration (enabled=False when it has none)."""
        answer = await self._bucket_setting(bucket, "object-lock")
        if answer.status == 404:
            code = parse_error_code(answer.body) or "404"
            if code in ("ObjectLockConfigurationNotFoundError", "ObjectLockConfigurationNotFound"):
                return ObjectLock(enabled=False)
            raise StorageRejected(code, f"S3 answered {code} to the object lock of {bucket}")
        try:
            return parse_object_lock(answer.body)
        except MalformedAnswer as exc:
            raise self._malformed(f"the object lock of s3://{bucket}", str(exc)) from None


def _why(exc: BaseException) -> str:
    """A transport failure in a few words; a TLS verification failure says what to check."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError)):
            return "its TLS certificate is not trusted; check spec.storage's CA bundle or verify_ssl"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "no connection within the connect timeout"
    if isinstance(exc, aiohttp.ServerTimeoutError):  # SocketTimeoutError: silence for the read timeout
        return "no data within the read timeout"
    return type(exc).__name__


def _proxy(url: yarl.URL) -> str | None:
    """The proxy for `url` from HTTPS_PROXY / HTTP_PROXY and NO_PROXY (the standard library reads them as curl does)."""
    host = url.host or ""
    if not host or proxy_bypass(host):
        return None
    return getproxies().get(url.scheme)
