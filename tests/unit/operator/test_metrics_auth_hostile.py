"""The operator's metrics filter (kube/authn.py) against a hostile scraper and a hostile apiserver, without a cluster.

The scraper sends no header, several, other schemes, huge tokens, characters no token has: 401, and the apiserver is
never asked. The apiserver answers 500, nothing in time, garbage, a refusal of the operator's own review: 503 naming
why, never a 500, never cached. Verdicts are cached by a hash of the token, bounded, shared by concurrent requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from arbiter_operator.kube import authn
from arbiter_operator.kube.authn import Denied, NonResource, Reviewer
from arbiter_operator.kube.transport import AnswerTooLong
from support.review_standin import ALLOWED, TOKEN, USER, Answer, Apiserver, review


def reviewer(api: Apiserver, clock: Callable[[], float] | None = None, **kw: Any) -> Reviewer:
    return Reviewer(api, NonResource("/metrics", "get"), clock=clock or (lambda: 0.0), **kw)


async def denied(r: Reviewer, values: list[str]) -> Denied:
    with pytest.raises(Denied) as info:
        await r.authorize(values)
    return info.value


async def test_a_token_the_apiserver_authenticates_and_allows_is_the_user_it_names() -> None:
    api = Apiserver()
    user = await reviewer(api).authorize([f"Bearer {TOKEN}"])
    assert user.name == USER["username"] and user.uid == "u-1" and "system:authenticated" in user.groups
    (tr_path, tr), (sar_path, sar) = api.sent
    assert (tr_path, tr["kind"], tr["spec"]) == (authn.TOKENREVIEWS, "TokenReview", {"token": TOKEN})
    # controller-runtime's filter: the user, its uid, groups and extra, and the non-resource URL with the verb.
    assert (sar_path, sar["kind"]) == (authn.SUBJECTACCESSREVIEWS, "SubjectAccessReview")
    assert sar["spec"] == {"user": USER["username"], "uid": "u-1", "groups": USER["groups"], "extra": USER["extra"],
                           "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    assert "resourceAttributes" not in sar["spec"]


@pytest.mark.parametrize("values", [
    [], [""], ["Bearer"], ["Bearer "], ["Bearer \t "], ["Basic dXNlcjpwYXNz"], [f"Token {TOKEN}"], [TOKEN],
    [f"Bearer {TOKEN}", f"Bearer {TOKEN}"],  # two headers: which one would be judged?
    ["Bearer " + "a" * (authn.MAX_TOKEN_BYTES + 1)],
    [f"Bearer {TOKEN} {TOKEN}"], ["Bearer abc\x00def"], ["Bearer abc\ndef"], ["Bearer ünïcödé"], ["Bearer a,b"],
    ["Bearer " + "\udcff" * 4], ['Bearer "quoted"'], ["Bearer a;b=c"],
], ids=lambda v: repr(v)[:40])
async def test_a_malformed_authorization_is_401_without_asking_the_apiserver(values: list[str]) -> None:
    api = Apiserver()
    exc = await denied(reviewer(api), values)
    assert exc.status == 401
    assert api.sent == []
    assert all(v[7:] not in exc.message for v in values if len(v) > 12)  # nothing of the token is said back


async def test_the_largest_token_is_still_asked_about() -> None:
    api = Apiserver()
    await reviewer(api).authorize(["bearer " + "a" * authn.MAX_TOKEN_BYTES])  # the scheme in any case, like RFC 7235
    assert len(api.sent) == 2


async def test_a_token_the_apiserver_does_not_authenticate_is_401_and_kept() -> None:
    for status in ({"authenticated": False, "error": "invalid bearer token"}, {"authenticated": True},
                   {"authenticated": True, "user": {"username": ""}}, {"authenticated": "yes", "user": USER},
                   {"authenticated": True, "user": ["not", "a", "user"]}):
        api = Apiserver({authn.TOKENREVIEWS: review(status)})
        r = reviewer(api)
        assert (await denied(r, [f"Bearer {TOKEN}"])).status == 401
        assert (await denied(r, [f"Bearer {TOKEN}"])).status == 401
        assert len(api.sent) == 1, status  # the second costs no call, and no SubjectAccessReview was sent


async def test_a_user_the_apiserver_does_not_allow_is_403_naming_the_user_and_the_grant() -> None:
    for status in ({"allowed": False}, {"allowed": False, "denied": True, "reason": "no"}, {}, {"allowed": "true"}):
        api = Apiserver({**ALLOWED, authn.SUBJECTACCESSREVIEWS: review(status)})
        exc = await denied(reviewer(api), [f"Bearer {TOKEN}"])
        assert exc.status == 403
        assert USER["username"] in exc.message and "get /metrics" in exc.message and "metrics-reader" in exc.message
        assert TOKEN not in exc.message


@pytest.mark.parametrize(("answer", "said"), [
    ((500, b'{"kind":"Status","code":500}'), "answered the tokenreviews with 500"),
    ((502, b"<html>bad gateway</html>"), "with 502"),
    ((429, b"{}"), "with 429"),
    ((404, b"{}"), "with 404"),  # an apiserver without the authentication API
    ((401, b"{}"), "refused the operator's own tokenreviews (401)"),
    ((403, b"{}"), "grant the operator's ServiceAccount create on tokenreviews and subjectaccessreviews"),
    ((201, b"not json"), "is not JSON"),
    ((201, b'{"status": '), "is not JSON"),
    ((201, b"[1, 2]"), "has no status"),
    ((201, b'{"status": "ok"}'), "has no status"),
    ((201, b'{"kind": "TokenReview"}'), "has no status"),
    ((201, b"\xff\xfe\x00"), "is not JSON"),
    ((201, b"[" * 5000), "is not JSON"),
    (TimeoutError(), "did not answer the tokenreviews within 5s"),
    (aiohttp.ClientConnectionError("refused"), "unreachable (ClientConnectionError)"),
    (aiohttp.ServerDisconnectedError(), "unreachable (ServerDisconnectedError)"),
    (ConnectionResetError(), "unreachable (ConnectionResetError)"),
    (AnswerTooLong("an answer longer than 1048576 bytes"), "too long to be a review"),
    (aiohttp.ClientPayloadError("cut short"), "unreachable (ClientPayloadError)"),
    (RuntimeError("the kubeconfig's exec plugin failed"), "the review failed (RuntimeError)"),
], ids=lambda v: v if isinstance(v, str) else None)
async def test_an_apiserver_that_cannot_judge_is_503_naming_why_and_asked_again(answer: Answer, said: str) -> None:
    api = Apiserver({**ALLOWED, authn.TOKENREVIEWS: answer})
    r = reviewer(api)
    exc = await denied(r, [f"Bearer {TOKEN}"])
    assert exc.status == 503 and said in exc.message, exc.message
    assert TOKEN not in exc.message
    await denied(r, [f"Bearer {TOKEN}"])
    assert len(api.sent) == 2  # never kept: the next scrape asks again


async def test_a_failing_subjectaccessreview_is_503_too() -> None:
    api = Apiserver({**ALLOWED, authn.SUBJECTACCESSREVIEWS: (500, b"{}")})
    exc = await denied(reviewer(api), [f"Bearer {TOKEN}"])
    assert exc.status == 503 and "subjectaccessreviews with 500" in exc.message


async def test_a_kept_verdict_costs_no_call_until_it_expires() -> None:
    now = [0.0]
    api = Apiserver()
    r = reviewer(api, clock=lambda: now[0], ttl=10.0)
    for _ in range(5):
        await r.authorize([f"Bearer {TOKEN}"])
    assert len(api.sent) == 2 and r.api_calls == 2
    now[0] = 9.9
    await r.authorize([f"Bearer {TOKEN}"])
    assert len(api.sent) == 2
    now[0] = 10.0  # expired: asked again
    await r.authorize([f"Bearer {TOKEN}"])
    assert len(api.sent) == 4


async def test_the_cache_is_bounded_least_recently_used_first_and_keyed_by_a_hash() -> None:
    api = Apiserver()
    r = reviewer(api, size=2)
    tokens = [f"token-{i}" for i in range(3)]
    await r.authorize([f"Bearer {tokens[0]}"])
    await r.authorize([f"Bearer {tokens[1]}"])
    await r.authorize([f"Bearer {tokens[0]}"])  # used again: tokens[1] is now the oldest
    await r.authorize([f"Bearer {tokens[2]}"])  # evicts tokens[1]
    assert r.api_calls == 6
    await r.authorize([f"Bearer {tokens[0]}"])
    assert r.api_calls == 6
    await r.authorize([f"Bearer {tokens[1]}"])
    assert r.api_calls == 8
    kept = r.verdicts._kept
    assert len(kept) == 2 and not any(t in key for key in kept for t in tokens)
    assert all(len(key) == 64 for key in kept)  # SHA-256, hex


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    gate = asyncio.Event()
    api = Apiserver(gate=gate)
    r = reviewer(api)
    scrapes = [asyncio.create_task(r.authorize([f"Bearer {TOKEN}"])) for _ in range(50)]
    other = asyncio.create_task(r.authorize(["Bearer another-token"]))
    await asyncio.sleep(0.01)
    assert len(api.sent) == 2  # one TokenReview per token so far, the rest waiting
    gate.set()
    users = await asyncio.gather(*scrapes, other)
    assert {u.name for u in users} == {USER["username"]}
    assert len(api.sent) == 4  # two reviews per token, not per request


async def test_waiters_get_a_503_when_the_review_they_wait_for_is_cancelled() -> None:
    gate = asyncio.Event()
    r = reviewer(Apiserver(gate=gate))
    first = asyncio.create_task(r.authorize([f"Bearer {TOKEN}"]))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(r.authorize([f"Bearer {TOKEN}"]))
    await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(Denied) as info:
        await second
    assert info.value.status == 503 and "interrupted" in info.value.message
    with pytest.raises(asyncio.CancelledError):
        await first
    assert r.verdicts._under_way == {}  # the next request starts a review of its own


async def test_a_waiter_that_gives_up_does_not_cancel_the_review_of_the_others() -> None:
    gate = asyncio.Event()
    api = Apiserver(gate=gate)
    r = reviewer(api)
    first = asyncio.create_task(r.authorize([f"Bearer {TOKEN}"]))
    await asyncio.sleep(0.01)
    impatient = asyncio.create_task(r.authorize([f"Bearer {TOKEN}"]))
    await asyncio.sleep(0.01)
    impatient.cancel()
    gate.set()
    assert (await first).name == USER["username"]
    assert len(api.sent) == 2


def test_the_review_bodies_carry_only_strings_from_an_odd_user() -> None:
    user = authn.user_of({"authenticated": True, "user": {
        "username": "alice", "uid": 7, "groups": "not-a-list", "extra": {"a": ["x", 1], "b": "y", "c": None}}})
    assert user == authn.User("alice", "", (), (("a", ("x",)), ("b", ()), ("c", ())))
    body = authn.access_review(user, NonResource())
    assert body["spec"]["extra"] == {"a": ["x"], "b": [], "c": []} and body["spec"]["groups"] == []


async def test_through_the_operators_transport_a_slow_dead_or_garbled_apiserver_is_503() -> None:
    """The real LoopTransport (what the operator's metrics server uses) in front of peers that misbehave."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer
    from arbiter_devenv.vllm_standin import free_port
    from arbiter_operator.kube.transport import LoopTransport
    from kubernetes import client as k8s

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    async def garbled(_: web.Request) -> web.Response:
        return web.Response(body=b"\x00" * 10 + b"{", content_type="application/json", status=201)

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b" " * 2048 + b"{}", content_type="application/json", status=201)

    app = web.Application()
    app.router.add_post("/slow" + authn.TOKENREVIEWS, slow)
    app.router.add_post("/garbled" + authn.TOKENREVIEWS, garbled)
    app.router.add_post("/huge" + authn.TOKENREVIEWS, huge)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    said = {}
    try:
        for name, host in (("slow", f"http://127.0.0.1:{server.port}/slow"),
                           ("garbled", f"http://127.0.0.1:{server.port}/garbled"),
                           ("huge", f"http://127.0.0.1:{server.port}/huge"),
                           ("dead", f"http://127.0.0.1:{free_port()}")):
            config = k8s.Configuration()
            config.host = host
            config.api_key = {"authorization": "Bearer the-operators-own"}
            transport = LoopTransport(config, asyncio.get_running_loop(), max_body_bytes=1024)
            try:
                exc = await denied(Reviewer(transport, timeout=0.3), [f"Bearer {TOKEN}"])
            finally:
                await transport.close()
            assert exc.status == 503
            said[name] = exc.message
    finally:
        await server.close()
    assert "did not answer the tokenreviews within 0.3s" in said["slow"]
    assert "is not JSON" in said["garbled"]
    assert "too long to be a review" in said["huge"]
    assert "unreachable (ClientConnectorError)" in said["dead"]
