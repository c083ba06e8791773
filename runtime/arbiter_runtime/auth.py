"""Bearer-token authentication and authorization for the decision server, checked by the cluster itself.

With `ARBITER_AUTH=true` (the operator renders it from `spec.exposure.auth`) every request except the kubelet's
health probes must send `Authorization: Bearer <token>`. The runtime asks the API server:

1. a TokenReview: is this token valid, and whose is it?
2. a SubjectAccessReview: may that user `get` this version's InferenceService? This is the check OpenShift AI's
   authenticating proxy (kube-rbac-proxy, configured by OpenShift AI's KServe) makes, so the same RoleBinding opens
   both doors, and a caller who can read the InferenceService can call it.
   For the Prometheus scrape (`/metrics`, `/metrics/vllm`) the question is another one: may that user `get` the
   non-resource URL `/metrics`? That is what the operator's own metrics endpoint and controller-runtime's metrics
   filter ask, so one grant (the chart's metrics-reader ClusterRole) lets Prometheus read both, and a caller of the
   model reads no metrics by being one. The platform proxy's `X-Remote-User` is never believed there: the proxy
   judged a caller of the InferenceService, not a reader of metrics.

The checks run in the runtime, not only in the platform's proxy, so the decision server is protected the same way
with or without that proxy (vanilla KServe, the stable Service, a pod in the namespace that bypasses the predictor
Service's `https` port). Behind the platform's proxy the request arrives without its Authorization header (the proxy
strips it after its own TokenReview and SubjectAccessReview, the same `get` check) and with the proxy's
`X-Remote-User`; that header is believed only when `ARBITER_AUTH_PROXY_HEADERS=true` (the operator renders it unless
a mesh sidecar intercepts the serving port) and the request comes from the pod's own loopback, where the proxy
container is the only other listener's client. From anywhere else the header is ignored and a bearer token is needed.
Results are cached briefly, keyed by a hash of the token (never the token itself), in a bounded LRU, and concurrent
requests with the same token share one review, so a steady caller costs no API call per decision. The API server being
unreachable, slow or refusing the runtime's own reviews is a 503 naming the reason: the caller cannot be judged, which
is neither "unauthorized" nor the server's bug.

The runtime's ServiceAccount needs `create` on tokenreviews and subjectaccessreviews (the `system:auth-delegator`
ClusterRole). OpenShift AI binds it for predictors with auth on; docs/security.md says how to bind it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("arbiter.runtime.auth")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Paths the kubelet reaches without credentials: probes must work before any token exists.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
# Paths Prometheus scrapes: with auth on, a token allowed `get` on the non-resource URL METRICS_URL (module docstring).
METRICS_PATHS = frozenset({"/metrics", "/metrics/vllm"})
METRICS_URL = "/metrics"
MAX_TOKEN_BYTES = 16 * 1024  # a projected ServiceAccount token is ~1 KB; OIDC tokens a few KB
# Characters of a bearer token (RFC 6750 b64token); anything else is refused without asking the API server.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")

LOOPBACK = frozenset({"127.0.0.1", "::1"})
PROXY_USER_HEADER = b"x-remote-user"  # kube-rbac-proxy's --auth-header-fields-enabled default field name

_caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("arbiter_caller", default=None)


def current_caller() -> str | None:
    """The authenticated user of the request being served (None with auth off): goes into each audit record."""
    return _caller.get()


class AuthDenied(Exception):
    """The request gets `status` (401, 403 or 503) and `message`; nothing of the token is in either."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Caller:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class AuthSettings:
    enabled: bool
    api_url: str = ""
    token_file: str = f"{SA_DIR}/token"
    ca_file: str | None = f"{SA_DIR}/ca.crt"
    namespace: str = ""
    inference_service: str = ""
    verb: str = "get"
    group: str = "serving.kserve.io"
    resource: str = "inferenceservices"
    cache_ttl_s: float = 10.0
    cache_size: int = 4096
    timeout_s: float = 3.0
    trust_proxy_headers: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuthSettings:
        enabled = env.get("ARBITER_AUTH", "false").strip().lower() in ("true", "1", "yes")
        if not enabled:
            return cls(enabled=False)
        url = env.get("ARBITER_AUTH_API_URL", "")
        if not url and env.get("KUBERNETES_SERVICE_HOST"):
            host = env["KUBERNETES_SERVICE_HOST"]
            host = f"[{host}]" if ":" in host else host
            url = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        namespace = env.get("ARBITER_AUTH_NAMESPACE", "")
        if not namespace:
            try:
                with open(f"{SA_DIR}/namespace", encoding="utf-8") as fh:
                    namespace = fh.read().strip()
            except OSError:
                namespace = ""
        ca = env.get("ARBITER_AUTH_CA_FILE", f"{SA_DIR}/ca.crt")
        return cls(
            enabled=True,
            api_url=url.rstrip("/"),
            token_file=env.get("ARBITER_AUTH_TOKEN_FILE", f"{SA_DIR}/token"),
            ca_file=ca or None,
            namespace=namespace,
            inference_service=env.get("ARBITER_AUTH_INFERENCESERVICE", ""),
            cache_ttl_s=float(env.get("ARBITER_AUTH_CACHE_TTL_S", "10")),
            trust_proxy_headers=env.get("ARBITER_AUTH_PROXY_HEADERS", "false").strip().lower() == "true",
        )

    def problems(self) -> list[str]:
        """What makes the settings unusable, checked at start-up so the pod fails fast and says why."""
        out: list[str] = []
        if not self.enabled:
            return out
        if not self.api_url:
            out.append("ARBITER_AUTH is true but no API server is known: set ARBITER_AUTH_API_URL "
                       "(in a pod, KUBERNETES_SERVICE_HOST is set by Kubernetes)")
        if not self.namespace:
            out.append("ARBITER_AUTH is true but ARBITER_AUTH_NAMESPACE is not set")
        if not self.inference_service:
            out.append("ARBITER_AUTH is true but ARBITER_AUTH_INFERENCESERVICE is not set")
        return out


def _token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """TokenReview + SubjectAccessReview against the API server, with a bounded, short-lived verdict cache."""

    def __init__(self, settings: AuthSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Caller | AuthDenied]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[Caller | AuthDenied]] = {}
        self._session: aiohttp.ClientSession | None = None
        self.api_calls = 0  # reviews sent: what the cache saves is visible in tests and metrics

    # -- the API server ------------------------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.settings.api_url.startswith("https://"):
            return False
        ctx = ssl.create_default_context(cafile=self.settings.ca_file) if self.settings.ca_file else \
            ssl.create_default_context()
        return ctx

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=16)
            # trust_env off: the review carries a caller's token, it must go to the API server and nowhere else.
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s))
        try:
            # Re-read on every review: the kubelet rotates the projected token file.
            with open(self.settings.token_file, encoding="utf-8") as fh:
                own_token = fh.read().strip()
        except OSError as exc:
            raise AuthDenied(503, f"cannot check credentials: the runtime's own ServiceAccount token "
                                  f"({self.settings.token_file}) is unreadable: {exc.strerror}") from None
        self.api_calls += 1
        try:
            async with self._session.post(self.settings.api_url + path, data=json.dumps(body),
                                          headers={"Authorization": f"Bearer {own_token}",
                                                   "Content-Type": "application/json",
                                                   "Accept": "application/json"}) as resp:
                raw = await resp.read()
                status = resp.status
        except TimeoutError:
            raise AuthDenied(503, f"cannot check credentials: the API server did not answer within "
                                  f"{self.settings.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            raise AuthDenied(503, f"cannot check credentials: the API server is unreachable "
                                  f"({type(exc).__name__})") from None
        if status in (401, 403):
            kind = path.rsplit("/", 1)[-1]
            raise AuthDenied(503, f"cannot check credentials: the API server refused the runtime's own {kind} "
                                  f"request ({status}); bind the predictor's ServiceAccount to the "
                                  "system:auth-delegator ClusterRole")
        if status != 201 and status != 200:
            raise AuthDenied(503, f"cannot check credentials: the API server answered {status}")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise AuthDenied(503, "cannot check credentials: the API server's answer is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("status"), dict):
            raise AuthDenied(503, "cannot check credentials: the API server's answer has no status")
        status_: dict[str, Any] = doc["status"]
        return status_

    async def _review(self, token: str, metrics: bool) -> Caller:
        st = await self._post("/apis/authentication.k8s.io/v1/tokenreviews",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                               "spec": {"token": token}})
        if st.get("authenticated") is not True or not isinstance(st.get("user"), dict):
            raise AuthDenied(401, "the bearer token was not accepted by the cluster (expired, revoked or not a "
                                  "cluster token)")
        user = st["user"]
        username = user.get("username")
        if not isinstance(username, str) or not username:
            raise AuthDenied(401, "the bearer token names no user")
        groups = tuple(g for g in user.get("groups") or () if isinstance(g, str))
        extra_raw = user.get("extra") or {}
        extra = tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in extra_raw.items()
                             if isinstance(v, list))) if isinstance(extra_raw, dict) else ()
        caller = Caller(username, str(user.get("uid") or ""), groups, extra)
        s = self.settings
        if metrics:
            attributes = {"nonResourceAttributes": {"path": METRICS_URL, "verb": "get"}}
            refusal = (f"user {caller.username!r} may not get {METRICS_URL}; bind it to the metrics-reader "
                       "ClusterRole to scrape this model's metrics")
        else:
            attributes = {"resourceAttributes": {"namespace": s.namespace, "group": s.group, "resource": s.resource,
                                                 "name": s.inference_service, "verb": s.verb}}
            refusal = (f"user {caller.username!r} may not {s.verb} {s.resource}/{s.inference_service} in namespace "
                       f"{s.namespace!r}; grant it (for example the namespace's view role) to call this model")
        sar = await self._post("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": caller.username, "uid": caller.uid, "groups": list(caller.groups),
                     "extra": {k: list(v) for k, v in caller.extra}, **attributes},
        })
        if sar.get("allowed") is not True:
            raise AuthDenied(403, refusal)
        return caller

    # -- the public check ----------------------------------------------------------------------------------------

    async def check(self, authorization: str | None, metrics: bool = False) -> Caller:
        """The caller for an Authorization header value, or AuthDenied(401|403|503). metrics: the request is a
        scrape, judged by `get` on METRICS_URL instead of `get` on the InferenceService (verdicts kept apart)."""
        if not authorization:
            raise AuthDenied(401, "authentication required: send Authorization: Bearer <token> (for example "
                                  "the output of `oc whoami -t` or a ServiceAccount token)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthDenied(401, "the Authorization header must be 'Bearer <token>'")
        if len(token) > MAX_TOKEN_BYTES or not set(token) <= _TOKEN_CHARS:
            raise AuthDenied(401, "the bearer token is malformed")
        key = _token_key(token) + (":metrics" if metrics else "")
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return self._verdict(hit[1])
        pending = self._inflight.get(key)
        if pending is not None:
            return self._verdict(await asyncio.shield(pending))
        fut: asyncio.Future[Caller | AuthDenied] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            try:
                result: Caller | AuthDenied = await self._review(token, metrics)
            except AuthDenied as exc:
                result = exc
            except (TypeError, ValueError, AttributeError, KeyError):
                result = AuthDenied(503, "cannot check credentials: the API server's answer is malformed")
            if not (isinstance(result, AuthDenied) and result.status == 503):
                # 401/403 are cached too (a hammering client costs nothing); a 503 is not, the next try asks again.
                self._cache[key] = (self._clock() + self.settings.cache_ttl_s, result)
                self._cache.move_to_end(key)
                while len(self._cache) > self.settings.cache_size:
                    self._cache.popitem(last=False)
            fut.set_result(result)
        except BaseException as exc:  # cancelled: waiters get a 503 rather than hang
            if not fut.done():
                fut.set_result(AuthDenied(503, f"cannot check credentials: {type(exc).__name__}"))
            raise
        finally:
            self._inflight.pop(key, None)
        return self._verdict(result)

    @staticmethod
    def _verdict(result: Caller | AuthDenied) -> Caller:
        if isinstance(result, AuthDenied):
            raise result
        return result

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _json_error(status: int, message: str) -> tuple[Message, bytes]:
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="arbiter"'))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    return {"type": "http.response.start", "status": status, "headers": headers}, \
        json.dumps({"error": message}).encode()


class AuthMiddleware:
    """Pure ASGI middleware: checks the request before the app sees it, and puts the caller in a context variable
    the audit record reads. Closes the authenticator's HTTP session when the server shuts down."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator | None):
        self.app = app
        self.auth = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.auth is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            auth = self.auth

            async def receive_and_close() -> Message:
                message = await receive()
                if message.get("type") == "lifespan.shutdown":
                    await auth.close()
                return message

            await self.app(scope, receive_and_close, send)
            return
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = proxy_user = None
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                header = value.decode("latin-1")
            elif name == PROXY_USER_HEADER:
                proxy_user = value.decode("latin-1")
        peer = (scope.get("client") or ("", 0))[0]
        scrape = scope.get("path") in METRICS_PATHS
        if proxy_user and self.auth.settings.trust_proxy_headers and peer in LOOPBACK and not scrape:
            # The platform's proxy in this pod has already run the same TokenReview + SubjectAccessReview.
            token = _caller.set(proxy_user)
            try:
                await self.app(scope, receive, send)
            finally:
                _caller.reset(token)
            return
        try:
            caller = await self.auth.check(header, metrics=scrape)
        except AuthDenied as exc:
            if exc.status == 503:
                log.warning("%s", exc.message)
            start, body = _json_error(exc.status, exc.message)
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        token = _caller.set(caller.username)
        try:
            await self.app(scope, receive, send)
        finally:
            _caller.reset(token)


def authenticator_from_env(env: Mapping[str, str]) -> Authenticator | None:
    """None with auth off; raises ValueError naming what is missing with auth on."""
    settings = AuthSettings.from_env(env)
    if not settings.enabled:
        return None
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    if settings.ca_file and settings.api_url.startswith("https://") and not os.path.exists(settings.ca_file):
        raise ValueError(f"ARBITER_AUTH is true but the API server's CA file {settings.ca_file} does not exist")
    return Authenticator(settings)
