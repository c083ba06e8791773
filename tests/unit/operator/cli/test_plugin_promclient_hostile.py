"""The plugin's Prometheus client against a hostile peer on loopback: whatever it answers (any status, any bytes,
any JSON shape), a query returns series or raises PrometheusError naming Prometheus; never another exception."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from arbiter_operator.cli.promclient import Prometheus, PrometheusError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


class Peer:
    status = 200
    body = b""


@pytest.fixture(scope="module")
def peer() -> Iterator[tuple[Peer, str]]:
    state = Peer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=12)
series = st.fixed_dictionaries({}, optional={"metric": json_values | st.dictionaries(st.text(max_size=5),
                                                                                      json_values, max_size=2),
                                             "value": json_values | st.tuples(st.floats(), st.text(max_size=6)),
                                             "values": json_values | st.lists(st.tuples(json_values, json_values),
                                                                              max_size=3)})
answers = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"status": st.sampled_from(["success", "error"]), "data": st.fixed_dictionaries({
        "resultType": st.sampled_from(["vector", "matrix", "scalar", "x"]),
        "result": json_values | st.lists(series | json_values, max_size=3)})}).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 200, 200, 400, 401, 403, 500, 503]), body=answers)
def test_any_answer_is_series_or_a_prometheus_error(peer: tuple[Peer, str], status: int, body: bytes) -> None:
    state, url = peer
    state.status, state.body = status, body
    prom = Prometheus(url, timeout=5)
    try:
        for ask in (lambda: prom.vector("up"), lambda: prom.matrix("up", 0, 60, 15)):
            try:
                got = ask()
            except PrometheusError as exc:
                assert url in str(exc)
                continue
            assert status == 200
            for labels, value in got:
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
                assert isinstance(value, float | list)
    finally:
        prom.close()
