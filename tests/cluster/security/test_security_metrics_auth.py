"""Who may read the metrics, judged by the real kube-apiserver: the operator's endpoint (HTTPS, its filter's
TokenReview and SubjectAccessReview) and a decision runtime's with auth on (`/metrics`, `/metrics/vllm`).

For both: no token is 401, a ServiceAccount token without the grant is 403 (a caller allowed to `get` the model's
InferenceService too: calling a model is not reading its metrics), and a token bound to the chart's metrics-reader
ClusterRole (applied as `helm template` renders it) gets the Prometheus text. The per-namespace recipe of
docs/install.md (a ServiceAccount, its `kubernetes.io/service-account-token` Secret, a ClusterRoleBinding) yields the
token the operator's PodMonitors present.
"""

from __future__ import annotations

import base64
import http.client
import pathlib
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_runtime.service import RuntimeOptions
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from support.identities import (
    bind_auth_delegator,
    bind_to_metrics_reader,
    chart_metrics_reader,
    grant_inferenceservice_get,
    service_account_token,
)
from support.operator_kit import eventually
from support.runtime_helpers import base_config
from support.webhook_kit import serving_certificate

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ISVC = "credit-v1"
DOC = {"amount": 120.0, "country": "DE"}


@pytest.fixture
def scrapers(control_plane: Any, namespace: str) -> Iterator[dict[str, Any]]:
    """Tokens of `reader` (bound to the chart's metrics-reader ClusterRole), `stranger` (no grant) and `caller`
    (`get` on the InferenceService ISVC, what a caller of the model has); `runtime`, the runtime's own account
    (system:auth-delegator, as OpenShift AI binds a predictor's with auth on)."""
    api = control_plane.api_client()
    role = chart_metrics_reader(api, release=f"m-{uuid.uuid4().hex[:8]}")["metadata"]["name"]
    bindings = [bind_to_metrics_reader(api, namespace, "reader", role), bind_auth_delegator(api, namespace, "runtime")]
    runtime = service_account_token(api, namespace, "runtime")
    grant_inferenceservice_get(api, namespace, "caller", ISVC)
    try:
        yield {"api": api, "role": role, "namespace": namespace, "runtime": runtime,
               **{name: service_account_token(api, namespace, name) for name in ("reader", "stranger", "caller")}}
    finally:
        rbac = client.RbacAuthorizationV1Api(api)
        for name in bindings:
            rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(role)
        api.close()


def _assert_prometheus_text(body: str, family: str) -> None:
    names = {f.name for f in text_string_to_metric_families(body)}
    assert family in names, sorted(names)[:20]


def _user(scrapers: dict[str, Any], account: str) -> str:
    return f"system:serviceaccount:{scrapers['namespace']}:{account}"


def test_the_operators_metrics_over_https_need_a_token_allowed_get_metrics(control_plane, scrapers, tmp_path):
    ca = serving_certificate(tmp_path / "tls")
    (tmp_path / "ca.crt").write_bytes(ca)
    op = OperatorProcess(control_plane.kubeconfig, [scrapers["namespace"]], log_dir=tmp_path / "operator",
                         metrics=True, metrics_auth=True, metrics_cert_dir=tmp_path / "tls").start()
    try:
        cafile = tmp_path / "ca.crt"
        status, body = op.metrics_get(cafile=cafile)
        assert status == 401 and "Bearer" in body
        assert op.metrics_get("not-a-cluster-token", cafile=cafile)[0] == 401
        for account in ("stranger", "caller"):
            status, body = op.metrics_get(scrapers[account], cafile=cafile)
            assert status == 403 and _user(scrapers, account) in body, body
            assert scrapers[account] not in body
        status, body = op.metrics_get(scrapers["reader"], cafile=cafile)
        assert status == 200, body
        _assert_prometheus_text(body, "arbiter_operator_reconcile")
        # Plain HTTP gets no page from the HTTPS port.
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(op.metrics_url.replace("https://", "http://"), timeout=5).read()
        # Nothing of the tokens in the operator's log.
        log = op.log()
        assert not any(scrapers[a] in log for a in ("reader", "stranger", "caller"))
    finally:
        op.stop()


@pytest.fixture
def guarded_runtime(control_plane, scrapers, standin, make_runtime, tmp_path: pathlib.Path):
    token_file = tmp_path / "runtime-token"
    token_file.write_text(scrapers["runtime"])
    env = {"ARBITER_AUTH": "true", "ARBITER_AUTH_API_URL": control_plane.server,
           "ARBITER_AUTH_CA_FILE": str(control_plane.ca_file), "ARBITER_AUTH_TOKEN_FILE": str(token_file),
           "ARBITER_AUTH_NAMESPACE": scrapers["namespace"], "ARBITER_AUTH_INFERENCESERVICE": ISVC}
    return make_runtime(base_config(standin.url), RuntimeOptions(env=env))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("path", "family"), [("/metrics", "arbiter_decisions"),
                                              ("/metrics/vllm", "vllm:kv_cache_usage_perc")])
def test_a_runtimes_metrics_with_auth_on_need_a_token_allowed_get_metrics(scrapers, guarded_runtime, path, family):
    with guarded_runtime.client() as http:
        r = http.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = http.get(path, headers=_bearer(scrapers["stranger"]))
        assert r.status_code == 403 and _user(scrapers, "stranger") in r.json()["error"]
        # Allowed to call the model, not to read its metrics.
        assert http.post("/v1/decisions", json=DOC, headers=_bearer(scrapers["caller"])).status_code == 200
        r = http.get(path, headers=_bearer(scrapers["caller"]))
        assert r.status_code == 403 and "metrics-reader" in r.json()["error"]
        r = http.get(path, headers=_bearer(scrapers["reader"]))
        assert r.status_code == 200, r.text
        _assert_prometheus_text(r.text, family)
        # The reader calls no model.
        assert http.post("/v1/decisions", json=DOC, headers=_bearer(scrapers["reader"])).status_code == 403
        assert http.get("/v2/health/ready").status_code == 200  # the probes stay open


def test_the_per_namespace_recipe_gives_the_token_the_podmonitors_present(scrapers, guarded_runtime):
    """docs/install.md: a ServiceAccount, its token Secret (named as the operator's --metrics-reader-secret), a
    ClusterRoleBinding to the metrics-reader ClusterRole; Prometheus reads the Secret's `token`."""
    api, ns = scrapers["api"], scrapers["namespace"]
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(ns, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="arbiter-metrics-reader")))
    core.create_namespaced_secret(ns, client.V1Secret(
        type="kubernetes.io/service-account-token",
        metadata=client.V1ObjectMeta(name="arbiter-metrics-reader",
                                     annotations={"kubernetes.io/service-account.name": "arbiter-metrics-reader"})))
    binding = bind_to_metrics_reader(api, ns, "arbiter-metrics-reader", scrapers["role"])
    try:
        def filled() -> str | None:
            data = core.read_namespaced_secret("arbiter-metrics-reader", ns).data or {}
            return base64.b64decode(data["token"]).decode() if data.get("token") else None

        token = eventually(filled, 60, "the token controller fills the Secret")
        with guarded_runtime.client() as http:
            for path in ("/metrics", "/metrics/vllm"):
                r = http.get(path, headers=_bearer(token))
                assert r.status_code == 200, (path, r.text)
    finally:
        client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(binding)


def test_a_hostile_scrape_of_the_operator_gets_a_4xx_never_a_500(control_plane, scrapers, tmp_path):
    serving_certificate(tmp_path / "tls")
    op = OperatorProcess(control_plane.kubeconfig, [scrapers["namespace"]], log_dir=tmp_path / "operator",
                         metrics=True, metrics_auth=True, metrics_cert_dir=tmp_path / "tls").start()
    ctx = ssl.create_default_context(cafile=str(tmp_path / "tls" / "tls.crt"))
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    values = ["Bearer", "Basic dXNlcjpwYXNz", "Bearer " + "a" * 17000, "Bearer a b", "Bearer \u00e9t\u00e9",
              f"Bearer {scrapers['reader']}x", f"bearer {scrapers['reader'][:-4]}"]
    try:
        with httpx.Client(verify=ctx, timeout=15) as http:
            for value in values:
                r = http.get(op.metrics_url, headers=[("Authorization", value.encode("utf-8"))])
                assert r.status_code in (400, 401), (value[:40], r.status_code, r.text)
            r = http.get(op.metrics_url, headers=[("Authorization", f"Bearer {scrapers['reader']}"),
                                                  ("Authorization", f"Bearer {scrapers['stranger']}")])
            assert r.status_code == 401 and "one Authorization header" in r.text
    finally:
        op.stop()
    assert "Error handling request" not in op.log()  # aiohttp's line for a handler that raised (a 500)
