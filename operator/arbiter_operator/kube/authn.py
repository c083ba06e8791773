"""Who may read an endpoint the operator serves, asked of the apiserver as controller-runtime's metrics filter
(`filters.WithAuthenticationAndAuthorization`) asks it: a TokenReview (whose bearer token is this?), then a
SubjectAccessReview for that user, its groups and extra, with `nonResourceAttributes` (`get` on the path `/metrics`).

Verdicts, as HTTP statuses (`Denied.status`; no message holds anything of the token):
- 401: no Authorization header (or more than one), not `Bearer <token>`, a token longer than MAX_TOKEN_BYTES or not
  made of token characters (refused without asking anyone), or a token the apiserver does not authenticate;
- 403: an authenticated user the apiserver does not allow (bind it to the chart's metrics-reader ClusterRole);
- 503: the apiserver could not judge: unreachable, slower than the timeout, an error status, an answer that is not a
  review, or the operator's own review requests refused. The scrape cannot be judged, which is neither
  "unauthorized" nor the operator's fault, so never a 500 (controller-runtime answers 500 there).

Verdicts are kept for `ttl` seconds, keyed by a SHA-256 of the token (never the token), in a bounded LRU, and the
requests that bring a token whose review is under way wait for that review instead of sending their own: a Prometheus
scraping every few seconds costs two API calls per token and ttl, and a flood with one token costs two. A 503 is not
kept: the next request asks again.

The reviews go through the operator's own apiserver transport (kube/transport.py), not a session of their own built
from the in-cluster files: the same credentials as every other request (in-cluster, or --kubeconfig with its client
certificate, exec plugin or token, `tls-server-name` and proxy), the projected token re-read as it rotates, answers
read up to a bound, and the requests counted in the operator's API request metrics. Built from the in-cluster files
alone, the filter would not run outside a pod (local development, the tests), and credentials would be read two ways.

The decision runtime makes the same two reviews for its own endpoints (arbiter_runtime.auth). The operator and the
runtime ship as separate distributions and share no code; the statuses, limits and cache rules are the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import aiohttp
import orjson

from .transport import AnswerTooLong

log = logging.getLogger("arbiter.authn")

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
MAX_TOKEN_BYTES = 16 * 1024  # a projected ServiceAccount token is about 1 KB, an OIDC token a few KB
# RFC 6750's b64token: anything else is refused without a review (it cannot be a token the apiserver issued).
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")
_CANNOT = "cannot check credentials"


class Denied(Exception):
    """`Denied(status, message)`: the request is answered `status` (401, 403 or 503) with `message`."""

    @property
    def status(self) -> int:
        return int(self.args[0])

    @property
    def message(self) -> str:
        return str(self.args[1])


class User(NamedTuple):
    """An authenticated user, as the TokenReview named it: what the SubjectAccessReview asks about."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]  # (key, values), sorted by key


@dataclass(frozen=True)
class NonResource:
    """The access a request asks for: a SubjectAccessReview's nonResourceAttributes."""

    path: str = "/metrics"
    verb: str = "get"


class Requester(Protocol):
    """kube/transport.py's LoopTransport, as the reviews use it."""

    async def request(self, method: str, path: str, body: bytes, query: list[tuple[str, str]], content_type: str,
                      timeout: float) -> tuple[int, str, bytes]: ...


def bearer_token(values: list[str]) -> str:
    """The token of a request's Authorization header values, or Denied(401) saying what is wrong with them."""
    if not values:
        raise Denied(401, "authentication required: send Authorization: Bearer <token>, the token of a "
                          "ServiceAccount bound to the metrics-reader ClusterRole")
    if len(values) > 1:
        raise Denied(401, "send one Authorization header, not several")
    scheme, _, rest = values[0].partition(" ")
    token = rest.strip(" \t")
    if scheme.lower() != "bearer" or not token:
        raise Denied(401, "the Authorization header must be 'Bearer <token>'")
    if len(token) > MAX_TOKEN_BYTES or _TOKEN.fullmatch(token) is None:
        raise Denied(401, "the bearer token is malformed")
    return token


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def user_of(review: Mapping[str, Any]) -> User:
    """The user a TokenReview's status authenticates, or Denied(401)."""
    user = review.get("user")
    user = user if isinstance(user, dict) else {}
    name = user.get("username")
    if review.get("authenticated") is not True or not isinstance(name, str) or not name:
        raise Denied(401, "the bearer token was not accepted by the cluster (expired, revoked, or not a token of "
                          "this cluster)")
    extra = user.get("extra")
    pairs = sorted((k, _strings(v)) for k, v in extra.items()) if isinstance(extra, dict) else []
    uid = user.get("uid")
    return User(name, uid if isinstance(uid, str) else "", _strings(user.get("groups")), tuple(pairs))


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def access_review(user: User, access: NonResource) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": user.name, "uid": user.uid, "groups": list(user.groups),
        "extra": {key: list(values) for key, values in user.extra},
        "nonResourceAttributes": {"path": access.path, "verb": access.verb}}}


Verdict = User | Denied


class Verdicts:
    """Recent verdicts by key (a bounded LRU, each kept `ttl` seconds) and the reviews under way, one per key."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._kept: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._under_way: dict[str, asyncio.Future[Verdict]] = {}

    def _recent(self, key: str) -> Verdict | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept[0] <= self.clock():
            del self._kept[key]
            return None
        self._kept.move_to_end(key)
        return kept[1]

    def _keep(self, key: str, verdict: Verdict) -> None:
        self._kept[key] = (self.clock() + self.ttl, verdict)
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    async def settle(self, key: str, review: Callable[[], Awaitable[Verdict]]) -> Verdict:
        """The verdict on `key`: a recent one, the one of the review under way, or the one `review` gives now."""
        recent = self._recent(key)
        if recent is not None:
            return recent
        under_way = self._under_way.get(key)
        if under_way is not None:
            return await asyncio.shield(under_way)  # a waiter that gives up leaves the review to the others
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._under_way[key] = future
        try:
            verdict = await review()
        except BaseException as exc:  # cancelled: the waiters get an answer rather than hang
            future.set_result(Denied(503, f"{_CANNOT}: the review was interrupted ({type(exc).__name__})"))
            raise
        finally:
            del self._under_way[key]
        if not (isinstance(verdict, Denied) and verdict.status == 503):
            self._keep(key, verdict)  # a 401 or 403 too: a client that retries a refused token costs nothing
        future.set_result(verdict)
        return verdict


class Reviewer:
    """Authentication (TokenReview) and authorization (SubjectAccessReview) of bearer tokens for one access."""

    def __init__(self, transport: Requester, access: NonResource | None = None, *, ttl: float = 10.0,
                 size: int = 4096, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self.access = access or NonResource()
        self.timeout = timeout  # seconds each review may take, within a scrape's own timeout
        self.verdicts = Verdicts(ttl, size, clock)
        self.api_calls = 0  # reviews sent: what the cache saves, for the tests

    async def authorize(self, authorization: list[str]) -> User:
        """The user of a request's Authorization header values, or Denied(401|403|503)."""
        token = bearer_token(authorization)
        key = hashlib.sha256(token.encode()).hexdigest()
        verdict = await self.verdicts.settle(key, lambda: self._judge(token))
        if isinstance(verdict, Denied):
            raise verdict
        return verdict

    async def _judge(self, token: str) -> Verdict:
        try:
            user = user_of(await self._create(TOKENREVIEWS, token_review(token)))
            answer = await self._create(SUBJECTACCESSREVIEWS, access_review(user, self.access))
        except Denied as denied:
            return denied
        except Exception as exc:  # whatever else the transport raises: the request is still answered, not a 500
            log.warning("a review failed: %s", type(exc).__name__)
            return Denied(503, f"{_CANNOT}: the review failed ({type(exc).__name__})")
        if answer.get("allowed") is not True:
            return Denied(403, f"user {user.name!r} may not {self.access.verb} {self.access.path}: bind it to the "
                               "metrics-reader ClusterRole")
        return user

    async def _create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create one review; its status, or Denied(503) naming why the apiserver could not judge."""
        kind = path.rsplit("/", 1)[1]
        self.api_calls += 1
        try:
            code, _, raw = await self.transport.request("POST", path, orjson.dumps(body), [], "application/json",
                                                        self.timeout)
        except TimeoutError:
            raise Denied(503, f"{_CANNOT}: the apiserver did not answer the {kind} within {self.timeout:g}s") from None
        except AnswerTooLong:
            raise Denied(503, f"{_CANNOT}: the apiserver's answer to the {kind} is too long to be a review") from None
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            raise Denied(503, f"{_CANNOT}: the apiserver is unreachable ({type(exc).__name__})") from None
        if code in (401, 403):
            raise Denied(503, f"{_CANNOT}: the apiserver refused the operator's own {kind} ({code}); grant the "
                              "operator's ServiceAccount create on tokenreviews and subjectaccessreviews (the "
                              "chart's ClusterRole does)")
        if code not in (200, 201):
            raise Denied(503, f"{_CANNOT}: the apiserver answered the {kind} with {code}")
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise Denied(503, f"{_CANNOT}: the apiserver's answer to the {kind} is not JSON") from None
        status = doc.get("status") if isinstance(doc, dict) else None
        if not isinstance(status, dict):
            raise Denied(503, f"{_CANNOT}: the apiserver's answer to the {kind} has no status")
        return status
