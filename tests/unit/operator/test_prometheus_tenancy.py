"""The Prometheus client on Thanos Querier's tenancy port, against a loopback stand-in that answers as its two
proxies do: kube-rbac-proxy reads the namespace from the URL and checks the verb the HTTP method implies (a POST would
be `create`, which `view` and the operator's grant do not hold), prom-label-proxy refuses a request without the
namespace. The stand-in records what it was sent; the client must send a GET with `namespace`, the token file's
current content, and keep the PromQL's own namespace matcher (prom-label-proxy accepts a matcher equal to the
enforced one)."""

from __future__ import annotations

import asyncio
import http.server
import json
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from arbiter_operator.clients.prometheus import PrometheusClient, PrometheusConfig, PrometheusError
from arbiter_operator.observe.analysis import run_analysis
from arbiter_operator.promotion.analysis import AnalysisQuery
from support.http_stub import answer, serving

SEEN: list[dict[str, Any]] = []
ALLOWED = {"credit-models"}  # namespaces the token may `get pods.metrics.k8s.io` in


class Tenancy(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        SEEN.append({"method": self.command, "path": url.path, "query": query,
                     "body": self.rfile.read(length).decode(), "auth": self.headers.get("Authorization", "")})
        namespace = (query.get("namespace") or [""])[0]
        verb = {"GET": "get", "HEAD": "get"}.get(self.command, "create")
        if not namespace:  # prom-label-proxy
            answer(self, 400, b'{"status":"error","error":"Bad Request. The request or configuration is malformed."}')
        elif verb != "get" or namespace not in ALLOWED or not self.headers.get("Authorization"):  # kube-rbac-proxy
            answer(self, 403, b"Forbidden (user=system:serviceaccount:arbiter:arbiter, verb=" + verb.encode() + b")")
        else:
            answer(self, 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"namespace": namespace}, "value": [1, "3"]}]}}).encode())

    do_GET = do_POST = _handle


@pytest.fixture
def tenancy() -> Iterator[str]:
    SEEN.clear()
    with serving(Tenancy) as url:
        yield url


def _client(url: str, token_file: str) -> PrometheusClient:
    return PrometheusClient(PrometheusConfig.from_env({"ARBITER_PROMETHEUS_URL": url,
                                                       "ARBITER_PROMETHEUS_TENANCY": "true",
                                                       "ARBITER_PROMETHEUS_TOKEN_FILE": token_file}))


def test_each_query_is_a_get_for_one_namespace_with_the_current_projected_token(tenancy, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")

    async def go():
        async with _client(tenancy, str(token)) as prom:
            first = await prom.query('up{namespace="credit-models"}', namespace="credit-models")
            token.write_text("rotated\n")  # the kubelet renews a projected token in place
            await prom.query("up", namespace="credit-models")
            return first

    assert asyncio.run(go()) == [({"namespace": "credit-models"}, 3.0)]
    assert [s["method"] for s in SEEN] == ["GET", "GET"] and {s["path"] for s in SEEN} == {"/api/v1/query"}
    assert SEEN[0]["query"]["namespace"] == ["credit-models"]
    assert SEEN[0]["query"]["query"] == ['up{namespace="credit-models"}']
    assert [s["auth"] for s in SEEN] == ["Bearer first", "Bearer rotated"]


def test_a_query_without_a_namespace_is_refused_before_it_is_sent(tenancy, tmp_path):
    (tmp_path / "token").write_text("t")

    async def go():
        async with _client(tenancy, str(tmp_path / "token")) as prom:
            with pytest.raises(PrometheusError, match="one namespace"):
                await prom.query("up")

    asyncio.run(go())
    assert SEEN == []


def test_a_namespace_the_token_may_not_read_is_explained_without_the_token(tenancy, tmp_path):
    (tmp_path / "token").write_text("sha256~secret")

    async def go():
        async with _client(tenancy, str(tmp_path / "token")) as prom:
            with pytest.raises(PrometheusError) as err:
                await prom.query("up", namespace="other-team")
            return str(err.value)

    message = asyncio.run(go())
    assert "HTTP 403" in message and "other-team" in message and "pods.metrics.k8s.io" in message
    assert "secret" not in message


def test_the_analysis_asks_for_the_decision_models_namespace(tenancy, tmp_path):
    (tmp_path / "token").write_text("t")
    query = AnalysisQuery(version="1.1.0", step=0, at=datetime(2026, 1, 1, tzinfo=UTC), window_seconds=60,
                          queries={"requests": 'sum(up{namespace="credit-models"})', "errors": "vector(0)"},
                          p95_bound_ms=None, max_error_rate=0.01, min_requests=1, final=False)

    async def go():
        async with _client(tenancy, str(tmp_path / "token")) as prom:
            return await run_analysis(prom, query, "credit-models")

    asyncio.run(go())
    assert len(SEEN) == 2 and all(s["query"].get("namespace") == ["credit-models"] for s in SEEN)


@pytest.mark.parametrize("url, tenancy", [
    ("https://thanos-querier.openshift-monitoring.svc:9092", True),
    ("https://thanos-querier.openshift-monitoring.svc:9091", False),
    ("http://prometheus:9090", False),
])
def test_tenancy_follows_the_port_unless_said(url, tenancy):
    assert PrometheusConfig.from_env({"ARBITER_PROMETHEUS_URL": url}).tenancy is tenancy
    assert PrometheusConfig.from_env({"ARBITER_PROMETHEUS_URL": url,
                                      "ARBITER_PROMETHEUS_TENANCY": str(not tenancy).lower()}).tenancy is not tenancy


def test_the_web_port_keeps_the_promql_in_a_post_body(tenancy, tmp_path):
    async def go():
        cfg = PrometheusConfig.from_env({"ARBITER_PROMETHEUS_URL": tenancy, "ARBITER_PROMETHEUS_TENANCY": "false"})
        async with PrometheusClient(cfg) as prom:
            with pytest.raises(PrometheusError):
                await prom.query("up", namespace="credit-models")

    asyncio.run(go())
    assert SEEN[0]["method"] == "POST" and "query=up" in SEEN[0]["body"] and "namespace" not in SEEN[0]["query"]
