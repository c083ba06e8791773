"""With auth on, the runtime's metrics (/metrics, /metrics/vllm) need a token whose user may `get` the non-resource
URL /metrics, as the operator's metrics endpoint asks; decisions keep their InferenceService `get`; the probes stay
open. The apiserver is a stand-in on loopback that answers TokenReviews and SubjectAccessReviews from a table."""

from __future__ import annotations

import http.server
import json
import pathlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from arbiter_runtime.service import RuntimeOptions
from support.http_stub import answer, serving
from support.runtime_helpers import base_config

ISVC = "credit-v1"
USERS = {"prometheus-token": "system:serviceaccount:mon:prometheus",
         "caller-token": "system:serviceaccount:team-a:caller"}
DOC = {"amount": 120.0, "country": "DE"}


def _allowed(spec: dict[str, Any]) -> bool:
    """The RBAC the stand-in plays: prometheus may get /metrics, caller may get the InferenceService."""
    if spec["user"] == USERS["prometheus-token"]:
        return spec.get("nonResourceAttributes") == {"path": "/metrics", "verb": "get"}
    if spec["user"] == USERS["caller-token"]:
        return (spec.get("resourceAttributes") or {}).get("name") == ISVC
    return False


class _Apiserver(http.server.BaseHTTPRequestHandler):
    reviews: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).reviews.append(doc)
        if doc["kind"] == "TokenReview":
            name = USERS.get(doc["spec"]["token"])
            status: dict[str, Any] = {"authenticated": bool(name), "user": {"username": name, "groups": []}} \
                if name else {"authenticated": False}
        else:
            status = {"allowed": _allowed(doc["spec"])}
        answer(self, 201, json.dumps({**doc, "status": status}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def apiserver() -> Iterator[str]:
    _Apiserver.reviews = []
    with serving(_Apiserver) as url:
        yield url


@pytest.fixture
def guarded(apiserver: str, standin, make_runtime, tmp_path: pathlib.Path):
    token_file = tmp_path / "runtime-token"
    token_file.write_text("the-runtimes-own-token")
    env = {"ARBITER_AUTH": "true", "ARBITER_AUTH_API_URL": apiserver, "ARBITER_AUTH_TOKEN_FILE": str(token_file),
           "ARBITER_AUTH_NAMESPACE": "team-a", "ARBITER_AUTH_INFERENCESERVICE": ISVC,
           "ARBITER_AUTH_PROXY_HEADERS": "true"}
    return make_runtime(base_config(standin.url), RuntimeOptions(env=env))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", ["/metrics", "/metrics/vllm"])
def test_a_scrape_needs_a_token_allowed_get_on_the_metrics_url(guarded, path: str) -> None:
    with guarded.client() as http_client:
        r = http_client.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert _Apiserver.reviews == []
        r = http_client.get(path, headers=_bearer("caller-token"))  # may call the model, may not read its metrics
        assert r.status_code == 403
        assert USERS["caller-token"] in r.json()["error"] and "metrics-reader" in r.json()["error"]
        assert http_client.get(path, headers=_bearer("unknown-token")).status_code == 401
        r = http_client.get(path, headers=_bearer("prometheus-token"))
        assert r.status_code == 200, r.text
    sars = [d["spec"] for d in _Apiserver.reviews if d["kind"] == "SubjectAccessReview"]
    assert {json.dumps(s.get("nonResourceAttributes")) for s in sars} == {json.dumps({"path": "/metrics",
                                                                                     "verb": "get"})}
    assert not any("resourceAttributes" in s for s in sars)


def test_the_scrape_page_is_the_runtimes_metrics(guarded) -> None:
    with guarded.client() as http_client:
        r = http_client.get("/metrics", headers=_bearer("prometheus-token"))
    assert r.status_code == 200 and "arbiter_decisions_total" in r.text


def test_decisions_keep_the_inferenceservice_check_and_the_verdicts_stay_apart(guarded) -> None:
    with guarded.client() as http_client:
        assert http_client.post("/v1/decisions", json=DOC, headers=_bearer("caller-token")).status_code == 200
        # The same token for a scrape is judged again, for the other access, and refused.
        assert http_client.get("/metrics", headers=_bearer("caller-token")).status_code == 403
        # And the scraper's token calls no model.
        assert http_client.post("/v1/decisions", json=DOC, headers=_bearer("prometheus-token")).status_code == 403
        for _ in range(3):  # kept: no more reviews
            assert http_client.get("/metrics", headers=_bearer("prometheus-token")).status_code == 200
    decision_sar = next(d["spec"] for d in _Apiserver.reviews if d["kind"] == "SubjectAccessReview")
    assert decision_sar["resourceAttributes"] == {"namespace": "team-a", "group": "serving.kserve.io",
                                                  "resource": "inferenceservices", "name": ISVC, "verb": "get"}
    assert len(_Apiserver.reviews) == 8  # four tokens-and-accesses, two reviews each


def test_the_platform_proxys_user_header_opens_no_metrics(guarded) -> None:
    """Behind OpenShift AI's proxy a decision may come with X-Remote-User from loopback; a scrape never does."""
    proxied = {"X-Remote-User": "alice@example.com"}
    with guarded.client() as http_client:
        assert http_client.post("/v1/decisions", json=DOC, headers=proxied).status_code == 200
        assert http_client.get("/metrics", headers=proxied).status_code == 401
        assert http_client.get("/metrics/vllm", headers=proxied).status_code == 401


def test_the_probes_stay_open(guarded) -> None:
    with guarded.client() as http_client:
        assert http_client.get("/v2/health/live").status_code == 200
        assert http_client.get("/v2/health/ready").status_code == 200
    assert _Apiserver.reviews == []


def test_with_auth_off_the_metrics_are_open_as_before(runtime) -> None:
    with runtime.client() as http_client:
        assert http_client.get("/metrics").status_code == 200
        assert http_client.get("/metrics/vllm").status_code == 200
