"""The admission webhook without a cluster: which requests it refuses (the plan's own checks, only on a spec change),
and its decoding in front of kopf's handler against a hostile peer (any bytes, any shape, any depth): always an
answer (an AdmissionReview, or a 4xx naming what is wrong), never a 500, and nothing deep reaches kopf's dispatch."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from arbiter_operator import admission
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.examples import example

# The peer's server and client live on the session's loop, as its fixture does.
on_session_loop = pytest.mark.asyncio(loop_scope="session")


def dm(name: str = "credit-limit", namespace: str = "risk") -> dict[str, Any]:
    body = copy.deepcopy(example())
    body["metadata"].update(name=name, namespace=namespace)
    return body


def with_flag(body: dict[str, Any], *args: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["spec"]["serving"]["vllm"]["extraArgs"] = list(args)
    return body


def test_a_valid_spec_is_admitted() -> None:
    assert admission.review(dm(), None, "CREATE", None) is None


def test_the_plans_own_checks_refuse_at_create_and_on_a_spec_change() -> None:
    bad = with_flag(dm(), "--tensor-parallel", "4")
    message = admission.review(bad, None, "CREATE", None)
    assert message is not None and "extraArgs" in message and message.endswith("fix the spec to continue.")
    assert admission.review(bad, dm(), "UPDATE", None) == message


def test_an_update_that_keeps_the_spec_a_status_write_a_deletion_are_never_refused() -> None:
    bad = with_flag(dm(), "--tensor-parallel", "4")
    labelled = copy.deepcopy(bad)
    labelled["metadata"]["labels"] = {"team": "risk"}
    assert admission.review(labelled, bad, "UPDATE", None) is None
    assert admission.review(bad, None, "UPDATE", "status") is None
    assert admission.review(bad, None, "DELETE", None) is None
    deleting = copy.deepcopy(bad)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert admission.review(deleting, dm(), "UPDATE", None) is None


def test_the_host_name_limit_is_the_namespaces() -> None:
    version = dm()["spec"]["versions"][0]["name"]
    namespace = "n" * 20
    limit = 50 - len(namespace)
    at, over = dm("m" * (limit - len(version)), namespace), dm("m" * (limit - len(version) + 1), namespace)
    for body in (at, over):
        body["spec"]["exposure"] = {**body["spec"].get("exposure", {}), "host": "decide.apps.example.com"}
    assert admission.review(at, None, "CREATE", None) is None
    message = admission.review(over, None, "CREATE", None)
    assert message is not None and f"may be at most {limit} characters" in message


def test_a_spec_this_api_refuses_is_refused_with_the_field() -> None:
    body = dm()
    body["spec"]["versions"] = "v1"
    message = admission.review(body, None, "CREATE", None)
    assert message is not None and "spec.versions" in message


# --- the bounded decoding, against a hostile peer ---

def review_doc(obj: Any, old: Any = None, uid: str = "u-1") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "namespace": "risk", "userInfo": {"username": "dev"},
        "resource": {"group": "arbiter.dev", "version": "v1alpha1", "resource": "decisionmodels"},
        "object": obj, "oldObject": old}}


def nested(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


class Peer:
    """The webhook's decoding in front of a stand-in for kopf's dispatch that records what reached it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def fn(self, doc: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.seen.append(doc)
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": doc["request"]["uid"], "allowed": True}}

    def app(self) -> web.Application:
        async def serve(request: web.Request) -> web.StreamResponse:
            return await admission.BoundedWebhookServer._serve(self.fn, request)

        app = web.Application()
        app.router.add_post("/{id:.*}", serve)
        return app


@pytest.fixture
async def peer() -> Any:
    p = Peer()
    async with TestClient(TestServer(p.app())) as http:
        p.http = http  # type: ignore[attr-defined]
        yield p


async def post(peer: Any, data: bytes) -> tuple[int, Any]:
    resp = await peer.http.post("/decisionmodels", data=data, headers={"Content-Type": "application/json"})
    text = await resp.read()
    return resp.status, (json.loads(text) if text[:1] == b"{" else text)


@on_session_loop
async def test_an_object_nested_past_the_limit_is_refused_unread_with_its_uid(peer: Any) -> None:
    for levels in (admission.MAX_OBJECT_DEPTH + 1, 1_100, 5_000):
        data = json.dumps(review_doc("@@")).replace('"@@"', nested(levels)).encode()
        status, answer = await post(peer, data)
        assert status == 200, answer
        assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is False
        assert "64 levels" in answer["response"]["status"]["message"]
    assert peer.seen == []


@on_session_loop
async def test_a_deep_old_object_never_reaches_kopf_and_its_fix_is_judged(peer: Any) -> None:
    data = json.dumps(review_doc(dm(), "@@")).replace('"@@"', nested(500)).encode()
    status, answer = await post(peer, data)
    assert status == 200 and answer["response"]["allowed"] is True
    assert peer.seen and peer.seen[0]["request"]["oldObject"] is None


@on_session_loop
async def test_a_review_over_the_size_limit_is_413(peer: Any) -> None:
    big = review_doc({"metadata": {"name": "x"}, "pad": "x" * (admission.MAX_REVIEW_BYTES + 1)})
    status, _ = await post(peer, json.dumps(big).encode())
    assert status == 413 and peer.seen == []


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=8)
_request_keys = st.sampled_from(["uid", "operation", "namespace", "userInfo", "resource", "object", "oldObject",
                                 "subResource"])


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "mangled", "truncated", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(_json)).encode()
    doc = review_doc(dm())
    if kind == "mangled":
        for key in draw(st.lists(_request_keys, max_size=3)):
            doc["request"][key] = draw(_json)
        return json.dumps(doc).encode()
    data = json.dumps(doc).encode()
    if kind == "truncated":
        return data[: draw(st.integers(0, len(data) - 1))]
    return json.dumps(review_doc("@@")).replace('"@@"', nested(draw(st.integers(1, 3000)))).encode()


@on_session_loop
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hostile_bodies())
async def test_any_body_gets_an_answer_never_a_500(peer: Any, data: bytes) -> None:
    status, answer = await post(peer, data)
    assert status in (200, 400), (status, answer)
    if status == 400:
        assert isinstance(answer, dict) and answer["error"], answer  # names what is wrong
    else:
        assert answer["kind"] == "AdmissionReview" and isinstance(answer["response"]["uid"], str)
    for doc in peer.seen:  # what reached kopf is a review it can dispatch, and shallow
        assert admission.shape_problem(doc) is None
