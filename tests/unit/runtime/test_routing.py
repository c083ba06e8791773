"""Context routing between real decision servers on loopback: a pinned context is decided (audited, counted) by its
version and only by it; the forwarding version records no decision; unknown contexts and requests without the header
are decided where they land; a hostile or absent pinned version is a 503 naming it, never a 500 or a hang; a request
whose token the platform's proxy kept is refused by name (no identity could be passed on); routing.json is re-read
live and anything hostile in it means "no routes"."""

from __future__ import annotations

import functools
import http.server
import json
import time
from pathlib import Path

import pytest
from arbiter_runtime.routing import ROUTED_HEADER, RoutingConfigError, parse_routing
from arbiter_runtime.service import RuntimeOptions
from hypothesis import given, settings
from hypothesis import strategies as st
from support.http_stub import answer, serving
from support.polling import eventually
from support.runtime_helpers import ListSink, base_config, scrape, v2_body, value

DOC = {"amount": 120.0, "country": "DE"}
CONTEXT = {"x-decision-context": "underwriting"}
wait_for = functools.partial(eventually, timeout=15.0, interval=0.02)


def routing_json(path: Path, *routes: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"routes": list(routes)}))
    tmp.replace(path)


def route(url: str, version: str = "v2", value_: str = "underwriting", timeout_ms: int = 5000) -> dict:
    return {"header": "X-Decision-Context", "value": value_, "version": version, "url": url, "timeoutMs": timeout_ms}


def decisions(server, version: str) -> float:
    samples = scrape(server)
    return sum(value(samples, "arbiter_decisions_total", model="credit", version=version, outcome=o, source=s)
               for o, s in (("ok", "model"), ("low_confidence", "model"), ("fallback", "rules"), ("error", "none")))


def routed(server, to: str, result: str) -> float:
    return value(scrape(server), "arbiter_routed_requests_total", model="credit", version="v1", to=to, result=result)


@pytest.fixture
def stable_and_pinned(standin, make_runtime, tmp_path):
    """v1 (stable) routes x-decision-context=underwriting to v2 (pinned); v2 has the same routing.json and decides
    its own context."""
    for v in ("v1", "v2"):
        (tmp_path / v).mkdir()
    pinned = make_runtime(base_config(standin.url, version="v2"),
                          RuntimeOptions(audit_sinks=[ListSink()], routing_config=str(tmp_path / "v2/routing.json"),
                                         shadow_poll_s=0.05))
    stable = make_runtime(base_config(standin.url),
                          RuntimeOptions(audit_sinks=[ListSink()], routing_config=str(tmp_path / "v1/routing.json"),
                                         shadow_poll_s=0.05))
    for v in ("v1", "v2"):
        routing_json(tmp_path / v / "routing.json", route(pinned.url))
    wait_for(lambda: stable.runtime.routing.routes and not pinned.runtime.routing.routes, what="routes read")
    return stable, pinned


def test_a_pinned_context_is_decided_audited_and_counted_by_its_version_only(stable_and_pinned):
    stable, pinned = stable_and_pinned
    with stable.client() as c:
        r = c.post("/v1/decisions", json=DOC, headers={"X-Decision-Context": "underwriting"})
        assert r.status_code == 200 and r.json()["version"] == "v2", r.text
        r = c.post("/v2/models/credit/infer", json=v2_body(DOC, DOC, id="batch-1"), headers=CONTEXT)
        assert r.status_code == 200 and r.json()["model_version"] == "v2", r.text
        assert c.post("/v1/decisions", json=DOC, headers={"x-decision-context": "claims"}).json()["version"] == "v1"
        assert c.post("/v1/decisions", json=DOC).json()["version"] == "v1"
    # The deciding version audits and counts what it decided; the forwarding one what it decided itself.
    assert [r["version"] for r in pinned.records_since(0)] == ["v2", "v2", "v2"]
    assert [r["version"] for r in stable.records_since(0)] == ["v1", "v1"]
    assert decisions(pinned, "v2") == 3 and decisions(stable, "v1") == 2
    assert routed(stable, "v2", "forwarded") == 2
    # The pinned version decides its own context itself (its routes to itself are left out).
    with pinned.client() as c:
        assert c.post("/v1/decisions", json=DOC, headers=CONTEXT).json()["version"] == "v2"


def test_routes_change_live_and_a_broken_file_routes_nothing(stable_and_pinned, tmp_path):
    stable, _pinned = stable_and_pinned
    path = tmp_path / "v1/routing.json"
    path.write_text("{not json")
    wait_for(lambda: not stable.runtime.routing.routes, what="broken routing.json dropped")
    with stable.client() as c:
        assert c.post("/v1/decisions", json=DOC, headers=CONTEXT).json()["version"] == "v1"
    assert value(scrape(stable), "arbiter_routing_config_errors_total", model="credit", version="v1") == 1
    path.unlink()
    assert not stable.runtime.routing.routes


class Hostile(http.server.BaseHTTPRequestHandler):
    """A pinned "version" at its worst, by the request's context value."""

    def do_POST(self) -> None:
        mode = self.headers.get("x-decision-context", "")
        self.rfile.read(int(self.headers.get("content-length", "0")))
        if mode == "hang":
            time.sleep(3)
            return
        if mode == "error":
            answer(self, 500, b"Traceback (most recent call last): ...", "text/plain")
        elif mode == "huge":
            answer(self, 200, b"[" + b"0," * (9 * 1024 * 1024) + b"0]")
        elif mode == "reset":
            self.close_connection = True  # hangs up without an answer
        else:
            answer(self, 200, json.dumps({"seen": {k.lower(): v for k, v in self.headers.items()}}).encode())

    def log_message(self, *args: object) -> None:
        pass


def test_a_pinned_version_at_its_worst_is_a_503_naming_it(standin, make_runtime, tmp_path):
    with serving(Hostile) as url:
        stable = make_runtime(base_config(standin.url), RuntimeOptions(
            audit_sinks=[ListSink()], routing_config=str(tmp_path / "routing.json"), shadow_poll_s=0.05))
        routing_json(tmp_path / "routing.json",
                     *(route(url, value_=m, timeout_ms=500) for m in ("hang", "error", "huge", "reset", "ok")))
        wait_for(lambda: stable.runtime.routing.routes, what="routes read")
        with stable.client() as c:
            for mode in ("hang", "error", "huge", "reset"):
                started = time.monotonic()
                r = c.post("/v1/decisions", json=DOC, headers={"x-decision-context": mode})
                assert r.status_code == 503, (mode, r.status_code, r.text)
                assert "v2" in r.json()["error"] and f"x-decision-context={mode}" in r.json()["error"]
                assert time.monotonic() - started < 3
            # What is passed on: the caller's credentials and the request's own headers, and where it came from.
            r = c.post("/v1/decisions", json=DOC, headers={"x-decision-context": "ok", "authorization": "Bearer t0k",
                                                           "cookie": "session=1", "x-other": "no"})
            seen = r.json()["seen"]
            assert seen["authorization"] == "Bearer t0k" and seen[ROUTED_HEADER] == "v1"
            assert "cookie" not in seen and "x-other" not in seen
            # A request forwarded here already is not forwarded again (the routes disagree for a moment).
            r = c.post("/v1/decisions", json=DOC, headers={"x-decision-context": "ok", ROUTED_HEADER: "v3"})
            assert r.status_code == 508 and "retry" in r.json()["error"]
        assert stable.records_since(0) == []  # nothing decided here, nothing audited here
        assert routed(stable, "v2", "error") == 4 and routed(stable, "v2", "loop") == 1


def test_without_a_token_to_pass_on_the_request_is_refused_by_name(standin, make_runtime, tmp_path):
    # Through the platform's proxy: the caller's name in X-Remote-User from loopback, its token kept by the proxy.
    env = {"ARBITER_AUTH": "true", "ARBITER_AUTH_API_URL": "http://127.0.0.1:9", "ARBITER_AUTH_NAMESPACE": "team",
           "ARBITER_AUTH_INFERENCESERVICE": "credit--v1", "ARBITER_AUTH_PROXY_HEADERS": "true"}
    stable = make_runtime(base_config(standin.url), RuntimeOptions(
        audit_sinks=[ListSink()], routing_config=str(tmp_path / "routing.json"), shadow_poll_s=0.05, env=env))
    routing_json(tmp_path / "routing.json", route("http://127.0.0.1:9"))
    wait_for(lambda: stable.runtime.routing.routes, what="routes read")
    with stable.client() as c:
        r = c.post("/v1/decisions", json=DOC, headers={**CONTEXT, "x-remote-user": "alice"})
        assert r.status_code == 421 and "Authorization: Bearer" in r.json()["error"], r.text
        assert c.post("/v1/decisions", json=DOC, headers={"x-remote-user": "alice"}).status_code == 200


def test_a_valid_routing_file_reads_back():
    routes = parse_routing({"routes": [route("http://a.ns.svc", "v2"), route("http://b.ns.svc", "v1", "claims")]},
                           own_version="v1")
    assert set(routes) == {"x-decision-context"} and set(routes["x-decision-context"]) == {"underwriting"}
    with pytest.raises(RoutingConfigError, match="two versions"):
        parse_routing({"routes": [route("http://a", "v2"), route("http://b", "v3")]}, own_version="v1")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                        max_size=5), max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(raw=json_values | st.fixed_dictionaries({"routes": st.lists(st.dictionaries(
    st.sampled_from(["header", "value", "version", "url", "timeoutMs", "extra"]), json_values), max_size=4)}))
def test_any_routing_file_is_routes_or_refused_by_name(raw):
    try:
        routes = parse_routing(raw, own_version="v1")
    except RoutingConfigError as exc:
        assert 0 < len(str(exc)) < 200
    else:
        assert all(r.version != "v1" for by_value in routes.values() for r in by_value.values())
