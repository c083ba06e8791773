"""The operator's Kubernetes requests (kube/client.py: every write, and the few reads not served from the watch
cache) against a hostile apiserver or a broken proxy in front of it: a real HTTP server on loopback that answers with
any status, any body, a lying or missing length, extra headers, or not at all. Every verb is awaited on an event loop,
by the operator's transport (kube/transport.py LoopTransport, aiohttp) or one the client makes for another loop.

What a user would notice if this broke: a reconcile that dies on an exception nobody can read (AttributeError,
UnicodeDecodeError) instead of the apiserver's own message, or a worker stuck for good on an answer that never ends.
Every answer is either the decoded object (2xx with a JSON object), a KubeError naming the status and the
apiserver's message, or a transport error, within the call's timeout."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import pytest
from arbiter_operator.kube import events
from arbiter_operator.kube.client import KubeError, RestKubeClient
from arbiter_operator.kube.transport import LoopTransport
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from support.loopback_peer import LoopbackPeer

BODIES = (
    b"", b"not json at all", b"[]", b"null", b'"Status"', b"{}", b"[1, 2]", b"\xff\xfe\x00garbage",
    b'{"kind": "Status", "code": 409, "reason": "Conflict", "message": "the object has been modified"}',
    b'{"kind": 5, "code": "410", "message": ["x"], "reason": {"a": 1}}',
    b'{"metadata": {"name": "x", "resourceVersion": "7"}}', b'{"kind": "Sta', b"[" * 50000,
    b'{"message": "\\ud800"}', b"<html><body>502 Bad Gateway</body></html>",
    b'{"items": 5}', b'{"items": [1, "x", null]}', b'{"items": [{"metadata": {"name": "cm"}}]}',
    b'{"resources": 5}', b'{"resources": [1, {"name": "configmaps"}]}',
)
STATUSES = (200, 201, 204, 301, 400, 401, 403, 404, 409, 410, 422, 429, 500, 502, 503, 504)
TRANSPORT = ("answer", "reset", "close", "bad_status_line", "short_body", "hang_after_headers", "hang")


class HostileWriteTarget(LoopbackPeer):
    """Answers each request with the next (how, status, body) of `script`."""

    name = "hostile-write-target"

    def __init__(self, hang_s: float = 1.0) -> None:
        self.hang_s = hang_s
        self.script: list[tuple[str, int, bytes]] = []
        self.seen: list[tuple[str, str, bytes]] = []  # (method, target, body) as received
        self.headers: list[dict[str, str]] = []  # each request's headers (lower-case names)
        self.extra_head = ""  # header lines added to every answer
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, target, headers, body = await self._read_request(reader)
                self.seen.append((method, target, body))
                self.headers.append(headers)
                how, status, payload = self.script.pop(0) if self.script else ("answer", 200, b"{}")
                if await self._break_connection(writer, how):
                    break
                if how == "hang":
                    await asyncio.sleep(self.hang_s)
                    break
                length_said = len(payload) + (10 if how == "short_body" else 0)
                cookie = "Set-Cookie: session=planted; Path=/\r\n" if how == "set_cookie" else ""
                writer.write(f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\n{cookie}"
                             f"{self.extra_head}Content-Length: {length_said}\r\n\r\n".encode())
                if how == "hang_after_headers":
                    await writer.drain()
                    await asyncio.sleep(self.hang_s)
                    break
                writer.write(payload)
                await writer.drain()
                if how == "short_body":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError,
                asyncio.CancelledError):
            pass  # the client went away, or the peer is stopping
        finally:
            writer.close()


@pytest.fixture(scope="module")
def peer():
    p = HostileWriteTarget().start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def operator_loop():
    """An event loop in a thread of its own, as kopf runs the operator's; the requests come from other threads."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="operator-loop")
    thread.start()
    yield loop
    for kube in CLIENTS:
        asyncio.run_coroutine_threadsafe(kube.close(), loop).result(5)
    for transport in TRANSPORTS.pop(loop, []):
        asyncio.run_coroutine_threadsafe(transport.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


TRANSPORTS: dict[asyncio.AbstractEventLoop, list[LoopTransport]] = {}  # closed with their loop


def _transport(peer: HostileWriteTarget, loop: asyncio.AbstractEventLoop, **kw) -> LoopTransport:
    transport = LoopTransport(_config(peer), loop, user_agent="arbiter-operator/test", **kw)
    TRANSPORTS.setdefault(loop, []).append(transport)
    return transport


def _config(peer: HostileWriteTarget) -> k8s.Configuration:
    config = k8s.Configuration(host=peer.url)
    config.api_key = {"BearerToken": "a-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    return config


def _client(peer: HostileWriteTarget, loop: asyncio.AbstractEventLoop | None = None) -> RestKubeClient:
    """loop: the client holds the operator's transport of that loop; None: it makes one for the loop it is awaited on
    (closed with the operator's loop, like the transports above)."""
    kube = RestKubeClient(k8s.ApiClient(_config(peer)), transport=_transport(peer, loop) if loop else None)
    CLIENTS.append(kube)
    return kube


CLIENTS: list[RestKubeClient] = []  # their own transports are closed with the operator's loop

# What a broken connection or an unreadable answer raises.
TRANSPORT_ERRORS = (aiohttp.ClientError, OSError)  # TimeoutError is an OSError


@pytest.fixture(params=["operator's", "made for the loop"])
def transport(request, operator_loop):
    return operator_loop if request.param == "operator's" else None


def _arguments(call: str) -> tuple:
    """The arguments of one RestKubeClient verb (`a<call>`)."""
    return {
        "apply": (_configmap(),),
        "create": (_configmap(),),
        "patch_status": ("arbiter.dev/v1alpha1", "DecisionModel", "risk", "dm", {"status": {"a": 1}}),
        "get": ("v1", "ConfigMap", "risk", "cm"),
        "list": ("v1", "ConfigMap", "risk", "arbiter.dev/decision-model=dm"),
        "delete": ("v1", "ConfigMap", "risk", "cm", "u1"),
        "event": (_involved(), "Normal", "Tested", "a message"),
        "served": ("v1", "ConfigMap"),
    }[call]


def _on(loop: asyncio.AbstractEventLoop, coro, timeout: float = 60):
    """Await `coro` on the operator's loop (its thread), as the reconcile does."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def _make(kube: RestKubeClient, call: str, loop: asyncio.AbstractEventLoop):
    return _on(loop, getattr(kube, "a" + call)(*_arguments(call)))


def _involved() -> dict:
    return _configmap() | {"metadata": {"name": "cm", "namespace": "risk", "uid": "u"}}


def _configmap() -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "risk"},
            "data": {"decision.json": "{}"}}


def test_an_honest_answer_is_the_decoded_object_and_the_request_is_what_the_apiserver_expects(peer, transport,
                                                                                              operator_loop):
    peer.script = [("answer", 200, b'{"metadata": {"name": "cm", "resourceVersion": "7"}}')]
    out = _make(_client(peer, transport), "apply", operator_loop)
    assert out["metadata"]["resourceVersion"] == "7"
    method, target, body = peer.seen[-1]
    assert method == "PATCH"
    assert target == "/api/v1/namespaces/risk/configmaps/cm?fieldManager=arbiter-operator&force=true"
    assert json.loads(body) == _configmap()
    headers = peer.headers[-1]
    assert headers["authorization"] == "Bearer a-token"
    assert headers["content-type"] == "application/apply-patch+yaml"
    if transport is not None:  # the replica's name, as the apiserver's audit log shows it
        assert headers["user-agent"] == "arbiter-operator/test"


def test_an_error_answer_names_the_apiservers_reason_and_message(peer, transport, operator_loop):
    peer.script = [("answer", 409, BODIES[8])]
    with pytest.raises(KubeError) as caught:
        _make(_client(peer, transport), "apply", operator_loop)
    assert (caught.value.status, caught.value.reason) == (409, "Conflict")
    assert "the object has been modified" in str(caught.value)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(TRANSPORT), status=st.sampled_from(STATUSES), body=st.sampled_from(BODIES),
       call=st.sampled_from(["apply", "create", "patch_status", "get", "list", "delete", "event", "served"]),
       on_loop=st.booleans())
def test_any_answer_is_an_object_a_kube_error_or_a_transport_error_in_time(peer, operator_loop, how, status, body,
                                                                           call, on_loop):
    peer.script = [(how, status, body)] * 5  # every attempt: the transport sends a request again on a dropped one
    kube = _client(peer, operator_loop if on_loop else None)
    started = time.monotonic()
    try:
        out = _make(kube, call, operator_loop)
    except KubeError as exc:
        # The apiserver's answer, named: its status code, and no traceback of the client's own.
        assert 100 <= exc.status < 600 and isinstance(exc.message, str) and isinstance(exc.reason, str)
        # The status the peer sent (its head arrived, even where its body did not), or 502: no object arrived.
        assert exc.status in (status, 502) and (how != "answer" or 200 <= status < 300 or exc.status == status)
    except TRANSPORT_ERRORS:
        # The connection broke, or the answer could not be read: a body after a 204 or 304 (HTTP forbids one there)
        # is a malformed answer to aiohttp's parser.
        assert how != "answer" or (status in (204, 304) and body)
    else:
        # Only an answer that carried an object counts as done (a get's 404 is "absent", an Event is a courtesy).
        assert ((how == "answer" and 200 <= status < 300 and isinstance(out, dict))
                or (call in ("get", "delete", "event", "served") and out in (None, False, True))
                or (call == "list" and isinstance(out, list) and all(isinstance(o, dict) for o in out)))
    # Bounded: a hung peer costs the call's timeout (30 s by default; the peer gives up after 1 s), never more.
    assert time.monotonic() - started < 35
    peer.script = []


@pytest.mark.parametrize("how", ["hang", "hang_after_headers"])
def test_a_hung_apiserver_costs_the_loop_transports_timeout(peer, operator_loop, how):
    """No answer at all, or a head and then nothing: the request gives up at its timeout, the worker is free."""
    peer.script = [(how, 200, b"{}")] * 5
    transport = _transport(peer, operator_loop)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _on(operator_loop, transport.request("GET", "/api/v1/namespaces/risk/configmaps/cm", b"", [],
                                             "application/json", 0.3))
    assert time.monotonic() - started < 0.3 + 0.5
    peer.script = []


def test_an_answer_longer_than_the_transport_accepts_is_refused_not_held(peer, operator_loop):
    big = b'{"metadata": {"name": "cm"}, "data": {"x": "' + b"a" * 200_000 + b'"}}'
    peer.script = [("answer", 200, big)]
    kube = RestKubeClient(k8s.ApiClient(_config(peer)),
                          transport=_transport(peer, operator_loop, max_body_bytes=100_000))
    with pytest.raises(aiohttp.ClientPayloadError, match="longer than 100000 bytes"):
        _make(kube, "apply", operator_loop)
    peer.script = []


def test_a_cookie_the_apiserver_sets_is_never_sent_back(peer, operator_loop):
    """A peer (or a proxy in front of the apiserver) that sets a cookie gets no cookie from the operator's later
    requests: nothing it plants rides along with the operator's credentials. By host name, since a cookie jar would
    refuse cookies of an IP address anyway."""
    config = _config(peer)
    config.host = peer.url.replace("127.0.0.1", "localhost")
    transport = LoopTransport(config, operator_loop)
    TRANSPORTS.setdefault(operator_loop, []).append(transport)
    peer.script = [("set_cookie", 200, b"{}"), ("answer", 200, b"{}")]
    for _ in range(2):
        _on(operator_loop, transport.request("GET", "/api/v1/namespaces/risk/configmaps/cm", b"", [],
                                             "application/json", 5))
    assert "cookie" not in peer.headers[-1]
    peer.script = []


def test_a_client_awaited_on_another_loop_makes_its_requests_there_not_on_the_operators(peer, operator_loop):
    """A tool or a test awaits the client on a loop of its own: the requests go through a transport of that loop
    (an aiohttp session is bound to one loop), never through the operator's, whose loop may be busy or elsewhere."""
    peer.script = [("answer", 200, b'{"metadata": {"name": "cm", "resourceVersion": "9"}}')]
    kube = _client(peer, operator_loop)

    async def elsewhere() -> dict:
        try:
            return await kube.aapply(_configmap())
        finally:
            await kube.close()

    out = asyncio.run(elsewhere())
    assert out["metadata"]["resourceVersion"] == "9"
    assert peer.headers[-1]["user-agent"] != "arbiter-operator/test"  # not the operator's transport
    peer.script = []


@pytest.mark.parametrize("body", [b'{"items": 5}', b'{"items": [1, "x", null]}', b'{"items": {"a": 1}}'])
def test_a_list_whose_items_are_not_objects_is_a_bad_response_named_not_a_crash(peer, operator_loop, body):
    peer.script = [("answer", 200, body)]
    with pytest.raises(KubeError) as caught:
        _make(_client(peer, operator_loop), "list", operator_loop)
    assert (caught.value.status, caught.value.reason) == (502, "BadResponse")
    assert "LIST of ConfigMap" in caught.value.message
    peer.script = []


@pytest.mark.parametrize(("body", "served"), [(b'{"resources": 5}', False), (b'{"resources": "configmaps"}', False),
                                              (b'{"resources": [1, null, {"name": "configmaps"}]}', True),
                                              (b'{"kind": "APIResourceList"}', False)])
def test_a_wrong_shaped_discovery_answer_is_an_answer_not_a_crash(peer, operator_loop, body, served):
    """Whether a kind is served (the PodMonitor API, Routes) is read from discovery: resources that are not a list,
    or entries that are not objects, mean what they hold of the kind, never a TypeError in the reconcile."""
    peer.script = [("answer", 200, body)]
    assert _make(_client(peer, operator_loop), "served", operator_loop) is served
    peer.script = []


@pytest.mark.parametrize("call", ["apply", "patch_status", "delete", "event"])
def test_a_dropped_kept_alive_connection_is_tried_again_but_never_an_event_post(peer, operator_loop, call):
    """The apiserver closed a kept-alive connection before answering: a server-side apply, merge patch or delete
    (idempotent) is sent once more on a fresh connection; an Event's POST is not (it would count twice)."""
    peer.script = [("close", 0, b""), ("answer", 200, b'{"metadata": {"name": "cm.1", "resourceVersion": "3"}}')]
    kube = _client(peer, operator_loop)
    before = len(peer.seen)
    if call == "event":
        with pytest.raises(aiohttp.ServerDisconnectedError):
            _make(kube, call, operator_loop)
        assert [m for m, _, _ in peer.seen[before:]] == ["POST"]
    else:
        assert _make(kube, call, operator_loop) in ({"metadata": {"name": "cm.1", "resourceVersion": "3"}}, True)
        assert len(peer.seen) - before == 2
    peer.script = []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(retry_after=st.one_of(st.sampled_from(["0", "-5", "abc", "99999999999", "Wed, 21 Oct 2015 07:28:00 GMT", ""]),
                             st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=30)),
       status=st.sampled_from([429, 503]), call=st.sampled_from(["apply", "get", "event"]))
def test_a_throttled_answer_is_the_apiservers_error_at_once_whatever_its_retry_after(peer, operator_loop,
                                                                                    retry_after, status, call):
    """A 429 or 503 with any Retry-After (none the apiserver would send, too): the reconcile gets the status and
    message at once (its own backoff decides when to come back), the Event is dropped with a warning; the client
    never sleeps on a value a proxy chose."""
    peer.extra_head = f"Retry-After: {retry_after}\r\n"
    peer.script = [("answer", status, b'{"kind": "Status", "reason": "TooManyRequests", "message": "slow down"}')]
    started = time.monotonic()
    try:
        if call == "event":
            assert _make(_client(peer, operator_loop), call, operator_loop) is None
        else:
            with pytest.raises(KubeError) as caught:
                _make(_client(peer, operator_loop), call, operator_loop)
            assert (caught.value.status, caught.value.reason, caught.value.message) == (status, "TooManyRequests",
                                                                                        "slow down")
    finally:
        peer.extra_head = ""
        peer.script = []
    assert time.monotonic() - started < 2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["answer", "reset", "bad_status_line", "short_body"]),
       status=st.sampled_from(STATUSES), body=st.sampled_from(BODIES))
def test_a_hostile_answer_to_a_series_write_loses_no_count_and_posts_again_only_when_the_event_is_gone(
        peer, operator_loop, how, status, body):
    """The second occurrence a minute on writes the series' count to its Event (a merge PATCH). Whatever comes back:
    a 404 (the Event expired) posts a new Event; an honest 2xx marks the count written; anything else leaves the count
    pending for the next write (never lost, never raised as the apiserver's refusal)."""
    kube, clock = _client(peer, operator_loop), Clock()
    kube.events.clock = clock
    peer.script = [("answer", 201, b'{"metadata": {"name": "cm.abc"}}')]
    _make(kube, "event", operator_loop)
    clock.now += events.SERIES_WRITE_INTERVAL
    peer.script = [(how, status, body)] + [("answer", 201, b'{"metadata": {"name": "cm.def"}}')] * 2
    before = len(peer.seen)
    try:
        _make(kube, "event", operator_loop)
    except TRANSPORT_ERRORS:
        assert how != "answer" or (status in (204, 304) and body)
    sent = [(m, t.split("?")[0]) for m, t, _ in peer.seen[before:]]
    assert sent[0] == ("PATCH", "/api/v1/namespaces/risk/events/cm.abc")
    (series,) = kube.events.series.values()
    gone = how == "answer" and status == 404
    assert (("POST", "/api/v1/namespaces/risk/events") in sent) == gone
    if gone:  # a new series, on the new Event
        assert (series.name, series.count) == ("cm.def", 1)
    else:
        assert (series.name, series.count) == ("cm.abc", 2)
        if how == "answer" and not 200 <= status < 300:  # refused: still pending, for the next write
            assert series.written_count == 1
        elif how == "answer" and status not in (204, 304) and body == BODIES[10]:  # an honest object: written
            assert series.written_count == 2
    peer.script = []
