"""The decision server with auth on, judged by the real kube-apiserver's TokenReview and SubjectAccessReview.

A caller ServiceAccount with `get` on the version's InferenceService gets a decision (and its identity is in the
audit record); one without gets 403; no token gets 401 (on the metrics too: only the probes are open); the runtime's
own ServiceAccount without `system:auth-delegator`, or an API server that is down, gets 503 naming the reason;
hostile Authorization headers never get a 500.
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import httpx
import pytest
from arbiter_devenv.vllm_standin import free_port
from arbiter_runtime.service import RuntimeOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from support.identities import bind_auth_delegator, grant_inferenceservice_get, service_account_token
from support.runtime_helpers import base_config, v2_body

ISVC = "credit-v1"
DOC = {"amount": 120.0, "country": "DE"}


@pytest.fixture
def cluster_auth(control_plane: Any, namespace: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    """ServiceAccounts: `runtime` (auth-delegator), `reader` (get on the InferenceService), `stranger` (nothing)."""
    api = control_plane.api_client()
    runtime_token = service_account_token(api, namespace, "runtime")
    crb = bind_auth_delegator(api, namespace, "runtime")
    grant_inferenceservice_get(api, namespace, "reader", ISVC)
    token_file = tmp_path / "runtime-token"
    token_file.write_text(runtime_token)
    unbound_file = tmp_path / "unbound-token"
    unbound_file.write_text(service_account_token(api, namespace, "unbound"))
    out = {
        "reader": service_account_token(api, namespace, "reader"),
        "stranger": service_account_token(api, namespace, "stranger"),
        "namespace": namespace,
        "env": {"ARBITER_AUTH": "true", "ARBITER_AUTH_API_URL": control_plane.server,
                "ARBITER_AUTH_CA_FILE": str(control_plane.ca_file), "ARBITER_AUTH_TOKEN_FILE": str(token_file),
                "ARBITER_AUTH_NAMESPACE": namespace, "ARBITER_AUTH_INFERENCESERVICE": ISVC},
        "unbound_file": str(unbound_file),
    }
    try:
        yield out
    finally:
        client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(crb)
        api.close()


def _serve(make_runtime, standin, env: dict[str, str]):
    return make_runtime(base_config(standin.url), RuntimeOptions(env=env))


def test_no_token_is_401_and_only_the_probes_stay_open(cluster_auth, standin, make_runtime):
    server = _serve(make_runtime, standin, cluster_auth["env"])
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC)
        assert r.status_code == 401
        assert "Bearer" in r.json()["error"] and r.headers["www-authenticate"].startswith("Bearer")
        assert http.post("/v2/models/credit/infer", json=v2_body(DOC)).status_code == 401
        assert http.get("/v2/models/credit").status_code == 401
        assert http.get("/v2/health/ready").status_code == 200
        assert http.get("/v2/health/live").status_code == 200
        # The scrape needs a token too (get on /metrics: tests/cluster/security/test_security_metrics_auth.py).
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics/vllm").status_code == 401
        r = http.post("/v1/decisions", json=DOC, headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
    assert server.records() == []  # nothing decided, nothing audited


def test_token_without_access_is_403_naming_user_and_inferenceservice(cluster_auth, standin, make_runtime):
    server = _serve(make_runtime, standin, cluster_auth["env"])
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC, headers={"Authorization": f"Bearer {cluster_auth['stranger']}"})
    assert r.status_code == 403
    msg = r.json()["error"]
    assert f"system:serviceaccount:{cluster_auth['namespace']}:stranger" in msg and ISVC in msg
    assert cluster_auth["stranger"] not in r.text
    assert server.records() == []


def test_valid_serviceaccount_token_gets_a_decision_with_caller_in_audit(cluster_auth, standin, make_runtime):
    server = _serve(make_runtime, standin, cluster_auth["env"])
    headers = {"Authorization": f"Bearer {cluster_auth['reader']}"}
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["decision"] in ("approve", "deny", "review")
        r2 = http.post("/v2/models/credit/infer", json=v2_body(DOC), headers=headers)
        assert r2.status_code == 200, r2.text
    records = server.records()
    assert len(records) == 2
    user = f"system:serviceaccount:{cluster_auth['namespace']}:reader"
    assert all(rec["caller"] == user for rec in records)
    assert all(cluster_auth["reader"] not in line for line in server.stdout.getvalue().splitlines())


def test_a_steady_caller_costs_one_review_not_two_calls_per_decision(cluster_auth, standin, make_runtime):
    from arbiter_runtime.auth import Authenticator

    server = _serve(make_runtime, standin, cluster_auth["env"])
    headers = {"Authorization": f"Bearer {cluster_auth['reader']}"}
    with server.client() as http:
        for _ in range(5):
            assert http.post("/v1/decisions", json=DOC, headers=headers).status_code == 200
    authenticators = [a for a in _find_authenticators(server.app) if isinstance(a, Authenticator)]
    assert len(authenticators) == 1
    assert authenticators[0].api_calls == 2  # one TokenReview + one SubjectAccessReview for five decisions


def _find_authenticators(app) -> list[Any]:
    layer, found = app.middleware_stack, []
    while layer is not None:
        if hasattr(layer, "auth"):
            found.append(layer.auth)
        layer = getattr(layer, "app", None)
    return found


def test_runtime_without_auth_delegator_answers_503_saying_what_to_bind(cluster_auth, standin, make_runtime):
    env = {**cluster_auth["env"], "ARBITER_AUTH_TOKEN_FILE": cluster_auth["unbound_file"]}
    server = _serve(make_runtime, standin, env)
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC, headers={"Authorization": f"Bearer {cluster_auth['reader']}"})
    assert r.status_code == 503
    assert "system:auth-delegator" in r.json()["error"]


def test_api_server_down_is_503_with_reason_never_500(cluster_auth, standin, make_runtime):
    env = {**cluster_auth["env"], "ARBITER_AUTH_API_URL": f"https://127.0.0.1:{free_port()}"}
    server = _serve(make_runtime, standin, env)
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC, headers={"Authorization": f"Bearer {cluster_auth['reader']}"})
    assert r.status_code == 503
    assert "unreachable" in r.json()["error"]
    assert r.headers.get("retry-after") == "1"


def test_platform_proxy_identity_trusted_only_from_loopback_and_when_enabled(cluster_auth, standin, make_runtime):
    """Behind OpenShift AI's kube-rbac-proxy the request has no Authorization header, only X-Remote-User."""
    import asyncio

    proxied = {"X-Remote-User": "alice@example.com"}
    server = _serve(make_runtime, standin, {**cluster_auth["env"], "ARBITER_AUTH_PROXY_HEADERS": "true"})
    with server.client() as http:
        r = http.post("/v1/decisions", json=DOC, headers=proxied)  # from 127.0.0.1: the pod's own proxy
        assert r.status_code == 200, r.text
    assert server.records()[-1]["caller"] == "alice@example.com"

    async def from_pod_network() -> int:
        transport = httpx.ASGITransport(app=server.app, client=("10.128.2.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as http:
            return (await http.post("/v1/decisions", json=DOC, headers=proxied)).status_code

    assert asyncio.run(from_pod_network()) == 401  # the same header from another pod is not believed

    plain = _serve(make_runtime, standin, cluster_auth["env"])  # ARBITER_AUTH_PROXY_HEADERS unset
    with plain.client() as http:
        assert http.post("/v1/decisions", json=DOC, headers=proxied).status_code == 401


_header_values = st.one_of(
    st.text(max_size=300),
    st.builds(lambda t: f"Bearer {t}", st.text(max_size=300)),
    st.builds(lambda t: f"Bearer {t}", st.text(alphabet="abcXYZ019-._~+/=", min_size=1, max_size=200)),
    st.builds(lambda n: "Bearer " + "a" * n, st.integers(16 * 1024 - 2, 16 * 1024 + 64)),
    st.just("Bearer"), st.just("bearer    "), st.just(f"Bearer {uuid.uuid4()}.{uuid.uuid4()}"),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_header_values)
def test_hostile_authorization_headers_get_401_never_500(cluster_auth, standin, make_runtime, value):
    server = _hostile_server(cluster_auth, standin, make_runtime)
    try:
        encoded = value.encode("latin-1")
    except UnicodeEncodeError:
        encoded = value.encode("utf-8")
    raw_headers = [(b"authorization", encoded), (b"content-type", b"application/json")]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        try:
            r = http.request("POST", "/v1/decisions", content=b'{"amount": 1, "country": "DE"}',
                             headers=raw_headers)
        except httpx.LocalProtocolError:
            return  # the client itself refuses to send it (a CR/LF in a header): nothing reached the server
    assert r.status_code in (400, 401), (value, r.status_code, r.text)
    assert server.records() == []


_hostile: dict[str, Any] = {}


def _hostile_server(cluster_auth, standin, make_runtime):
    # One server for all examples of a run (hypothesis calls the test body per example with the same fixtures).
    key = cluster_auth["namespace"]
    if key not in _hostile:
        _hostile.clear()
        _hostile[key] = _serve(make_runtime, standin, cluster_auth["env"])
    return _hostile[key]


def test_verdict_cache_is_bounded_and_expires(cluster_auth):
    import asyncio

    from arbiter_runtime.auth import AuthDenied, Authenticator, AuthSettings

    env = cluster_auth["env"]
    now = [0.0]
    settings_ = AuthSettings(enabled=True, api_url=env["ARBITER_AUTH_API_URL"], ca_file=env["ARBITER_AUTH_CA_FILE"],
                             token_file=env["ARBITER_AUTH_TOKEN_FILE"], namespace=env["ARBITER_AUTH_NAMESPACE"],
                             inference_service=ISVC, cache_size=1, cache_ttl_s=10)
    auth = Authenticator(settings_, clock=lambda: now[0])
    reader, stranger = f"Bearer {cluster_auth['reader']}", f"Bearer {cluster_auth['stranger']}"

    async def go() -> list[int]:
        calls = []
        try:
            await auth.check(reader)  # review: 2 calls
            calls.append(auth.api_calls)
            await auth.check(reader)  # cached
            calls.append(auth.api_calls)
            with pytest.raises(AuthDenied):
                await auth.check(stranger)  # 2 calls; evicts the reader (one entry only)
            calls.append(auth.api_calls)
            await auth.check(reader)  # evicted: reviewed again
            calls.append(auth.api_calls)
            now[0] += 11  # past the TTL
            await auth.check(reader)
            calls.append(auth.api_calls)
        finally:
            await auth.close()
        return calls

    assert asyncio.run(go()) == [2, 2, 4, 6, 8]
