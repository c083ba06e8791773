"""What the apply step and the refusal step make of any answer the apiserver gives (apply.py, refuse.py), against a
real HTTP peer on loopback through the operator's own client and transport: a child write or a status write answered
with any status and any body.

What a user would notice if this broke: a refused child write that leaves no trace on the DecisionModel, a pass
that dies on an exception nobody can read instead of the apiserver's words, or a DecisionModel the operator refuses
whose refusal vanishes because its status write failed."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import test_kube_writes_hostile as writes_hostile
from arbiter_operator.apply import apply_plan
from arbiter_operator.kube.client import KubeError, NotLeader, RestKubeClient
from arbiter_operator.plan.model import Plan
from arbiter_operator.plan.signals import TRANSIENT_REASONS
from arbiter_operator.plan.writes import CHILD_WRITE_REFUSED
from arbiter_operator.refuse import STATUS_REFUSED, refuse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from support.examples import example
from support.factory import make_dm
from support.loopback_peer import LoopbackPeer
from test_kube_writes_hostile import BODIES, STATUSES, _client

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NS = "risk"
CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": NS}, "data": {"a": "b"}}
OK = (200, b"{}")
operator_loop = writes_hostile.operator_loop  # the operator's event loop in a thread of its own (that file's fixture)


class Apiserver(LoopbackPeer):
    """Answers by request: `answers[(method, path suffix)]` (status, body), 404 for a GET it has no answer for, and
    200 {} for anything else. Keeps every request it received."""

    name = "hostile-apiserver"

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.seen: list[tuple[str, str, bytes]] = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def answer(self, method: str, path: str) -> tuple[int, bytes]:
        for (m, suffix), answer in self.answers.items():
            if m == method and path.split("?")[0].endswith(suffix):
                return answer
        return (404, b'{"kind": "Status", "code": 404, "reason": "NotFound"}') if method == "GET" else OK

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, target, _, body = await self._read_request(reader)
                self.seen.append((method, target, body))
                status, payload = self.answer(method, target)
                payload = b"" if status == 204 else payload  # framing is the transport's test (a 204 has no body)
                writer.write(f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def sent(self, method: str, suffix: str) -> list[dict[str, Any]]:
        return [json.loads(b) for m, t, b in self.seen if m == method and t.split("?")[0].endswith(suffix)]


@pytest.fixture(scope="module")
def apiserver():
    p = Apiserver().start()
    yield p
    p.stop()


def _kube(apiserver: Apiserver, loop: asyncio.AbstractEventLoop) -> RestKubeClient:
    return _client(apiserver, loop)  # type: ignore[arg-type]  # any peer with a url


def _decodes(status: int, body: bytes) -> bool:
    """Whether the client takes this answer for the object written (a 2xx with a JSON object; 204 has no body)."""
    try:
        return 200 <= status < 300 and status != 204 and isinstance(orjson.loads(body), dict)
    except ValueError:
        return False


def _refused_count(reason: str = STATUS_REFUSED) -> float:
    return REGISTRY.get_sample_value("arbiter_operator_objects_refused_total",
                                     {"kind": "DecisionModel", "reason": reason}) or 0.0


def _raw() -> dict[str, Any]:
    raw = example()
    raw["metadata"].update(namespace=NS, uid="uid-1", generation=1)
    return raw


def _run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from(STATUSES), body=st.sampled_from(BODIES))
def test_a_child_write_answered_anyhow_is_written_or_shown_on_the_decisionmodel(apiserver, operator_loop, status,
                                                                                body):
    apiserver.answers = {("PATCH", f"/namespaces/{NS}/configmaps/cm"): (status, body)}  # a create-only apply
    apiserver.seen = []
    raw = _raw()
    plan = Plan(children=[CM], deletions=[], status={"observedGeneration": 1, "conditions": []}, events=[],
                requeue_after=None)
    try:
        _, not_written = _run(operator_loop, apply_plan(_kube(apiserver, operator_loop), raw, make_dm(raw), plan,
                                                        {}, T0))
        raised = None
    except KubeError as exc:  # only an outage fails the pass (the work queue retries it with back-off)
        raised, not_written = exc, []
    if _decodes(status, body):
        assert raised is None and not_written == [], (status, body)
        return
    if 200 <= status < 300 or status in (408, 429) or status >= 500:  # not answered (a 2xx without the object too)
        assert raised is not None and (raised.status in (408, 429) or raised.status >= 500), (status, body, raised)
    else:  # a refusal: the pass goes on, the refusal is shown
        assert raised is None and not_written, (status, body)
    (patch,) = apiserver.sent("PATCH", f"/decisionmodels/{raw['metadata']['name']}/status")
    rec = next(c for c in patch["status"]["conditions"] if c["type"] == "Reconciling")
    assert rec["status"] == "True" and rec["reason"] in (CHILD_WRITE_REFUSED, *TRANSIENT_REASONS), rec
    assert f"ConfigMap {NS}/cm" in rec["message"], rec
    events = apiserver.sent("POST", f"/namespaces/{NS}/events")
    assert [e["reason"] for e in events] == [CHILD_WRITE_REFUSED], events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from(STATUSES), body=st.sampled_from(BODIES), event=st.sampled_from(STATUSES))
def test_a_refusal_whose_status_write_is_answered_anyhow_still_says_why(apiserver, operator_loop, status, body,
                                                                        event):
    raw = _raw()
    name = raw["metadata"]["name"]
    apiserver.answers = {("PATCH", f"/decisionmodels/{name}/status"): (status, body),
                         ("POST", f"/namespaces/{NS}/events"): (event, body)}
    apiserver.seen = []
    counted, shown = _refused_count(), _refused_count("InvalidSpec")
    message = "the spec does not match this operator's API: spec.versions: too deep"
    _run(operator_loop, refuse(_kube(apiserver, operator_loop), raw, message, T0))  # never raises
    (patch,) = apiserver.sent("PATCH", f"/decisionmodels/{name}/status")
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "InvalidSpec", message)
    events = apiserver.sent("POST", f"/namespaces/{NS}/events")
    if _decodes(status, body):
        assert [e["reason"] for e in events] == ["InvalidSpec"], events
        assert (_refused_count(), _refused_count("InvalidSpec")) == (counted, shown + 1)
        return
    # Not written: an Event says why, and the metric counts it.
    (said,) = events
    assert said["reason"] == STATUS_REFUSED and message in said["message"], said
    assert (_refused_count(), _refused_count("InvalidSpec")) == (counted + 1, shown)


def test_a_replica_that_no_longer_leads_writes_no_refusal_and_counts_none(apiserver, operator_loop):
    """Its lease lost, the replica's status write is fenced: that is not a refusal (no StatusRefused Event, no count);
    the pass ends and the leader writes the status."""
    apiserver.answers, apiserver.seen = {}, []
    kube = _kube(apiserver, operator_loop)
    kube.fence = lambda: False
    counted = _refused_count(), _refused_count("InvalidSpec")
    with pytest.raises(NotLeader):
        _run(operator_loop, refuse(kube, _raw(), "the spec does not match this operator's API: x", T0))
    assert apiserver.seen == [] and (_refused_count(), _refused_count("InvalidSpec")) == counted
