"""No credential in logs, events, status or error messages.

Canary values are planted in every credential the operator handles: the S3 secret key of the storage-config Secret
(the real S3 key on the happy path, a fake one on the failure path), a malformed storage-config entry, the registry
bearer token Secret, and the Prometheus token file. The servers on the failure paths are hostile in the way real ones
sometimes are: they echo the request's Authorization header back in their error body. The operator runs at debug log
level through success and failure; afterwards no canary (nor its base64 form) may appear in the operator's output, in
any Event of the namespace, or in any DecisionModel's status.
"""

from __future__ import annotations

import base64
import copy
import http.server
import json
import threading
import uuid
from collections.abc import Iterator

import pytest
from arbiter_devenv.operator_process import OperatorProcess
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get, seed_model_storage

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"


class _EchoAuth(http.server.BaseHTTPRequestHandler):
    """Answers every request 401 with the Authorization header it got in the body: a leaky server."""

    def _answer(self) -> None:
        body = json.dumps({"code": 401, "message": f"invalid credentials: {self.headers.get('Authorization')}",
                           "status": "error", "error": f"token {self.headers.get('Authorization')} rejected"})
        data = body.encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoAuth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _forms(value: str) -> set[str]:
    return {value, base64.b64encode(value.encode()).decode()}


def test_canary_credentials_never_leak(control_plane, namespace, s3_server, echo_server, tmp_path) -> None:
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns = namespace
    tag = uuid.uuid4().hex
    canaries = {
        "s3-real-secret-key": s3_server.secret_key,
        "s3-fake-secret-key": f"CANARYs3secret{tag}",
        "s3-malformed-entry": f"CANARYmalformed{tag}",
        "registry-token": f"CANARYregistry{tag}",
        "prometheus-token": f"CANARYprometheus{tag}",
    }

    # Happy path: real weights on the S3 server, read with the real (canary) secret key.
    seed_model_storage(s3_server, api, ns)
    # Failure paths: wrong key for the same endpoint, and an entry that is not JSON (with the canary inside).
    fake = {"type": "s3", "access_key_id": s3_server.access_key, "secret_access_key": canaries["s3-fake-secret-key"],
            "endpoint_url": s3_server.endpoint_url, "region": s3_server.region}
    core.create_namespaced_secret(ns, {"metadata": {"name": "wrong-key"}, "stringData": {"default": json.dumps(fake)}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "malformed"}, "stringData": {
        "default": '{"type": "s3", "secret_access_key": "' + canaries["s3-malformed-entry"] + '", '}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "registry-token"},
                                       "stringData": {"token": canaries["registry-token"]}})
    token_file = tmp_path / "prometheus-token"
    token_file.write_text(canaries["prometheus-token"])

    op = OperatorProcess(
        control_plane.kubeconfig, [ns], extra_args=("--log-level=debug",), log_dir=tmp_path,
        env={"ARBITER_PROMETHEUS_URL": echo_server, "ARBITER_PROMETHEUS_TOKEN_FILE": str(token_file)},
    ).start()
    try:
        base = example()
        two = copy.deepcopy(base)
        v2 = copy.deepcopy(two["spec"]["versions"][0])
        v2.update(name="1.1.0", storageUri="s3://models/credit-limit/1.1.0")
        two["spec"]["versions"].append(v2)

        # 1. Serves with the real key, then a canary promotion whose analysis asks the leaky "Prometheus".
        create_dm(api, ns, two)
        eventually(lambda: (condition(get(api, f"{G}/{V}", P, ns, "credit-limit") or {}, "Ready") or {})
                   .get("status") == "True", 90, "credit-limit Ready")
        custom.patch_namespaced_custom_object(G, V, ns, P, "credit-limit", {"spec": {"promote": {
            "version": "1.1.0", "strategy": "Canary", "steps": [{"weight": 10, "holdSeconds": 0}],
            "analysis": {"intervalSeconds": 5, "minRequests": 0, "insufficientTraffic": "Fail"}}}})

        # 2. The wrong S3 key, 3. the malformed entry, 4. the registry that echoes the token.
        for name, patch in {
            "wrong-key": {"storage": {"secretName": "wrong-key"}},
            "malformed": {"storage": {"secretName": "malformed"}},
            "leaky-registry": {"registry": {"url": echo_server, "tokenSecretRef": {"name": "registry-token"}}},
        }.items():
            body = copy.deepcopy(base)
            body["metadata"]["name"] = name
            body["spec"].update(patch)
            create_dm(api, ns, body)

        def failures_reported():
            wrong = get(api, f"{G}/{V}", P, ns, "wrong-key") or {}
            malformed = get(api, f"{G}/{V}", P, ns, "malformed") or {}
            registry = get(api, f"{G}/{V}", P, ns, "leaky-registry") or {}
            promo = ((get(api, f"{G}/{V}", P, ns, "credit-limit") or {}).get("status") or {}).get("promotion") or {}
            state = {
                "wrong-key ArtifactsValid": (condition(wrong, "ArtifactsValid") or {}).get("status"),
                "malformed ArtifactsValid": (condition(malformed, "ArtifactsValid") or {}).get("status"),
                "leaky-registry Registered": (condition(registry, "Registered") or {}).get("status"),
                "credit-limit analysis": (promo.get("lastAnalysis") or {}).get("verdict"),
            }
            # Each failure is reported (False, or Unknown while the storage cannot be read), never silently True.
            failed = ("False", "Unknown")
            assert all(state[k] in failed for k in list(state)[:3]) and state["credit-limit analysis"], state
            return True

        eventually(failures_reported, 120, "every failure path reported in status")
    finally:
        op.stop()

    statuses = {d["metadata"]["name"]: json.dumps(d.get("status") or {})
                for d in custom.list_namespaced_custom_object(G, V, ns, P)["items"]}
    events = [f"{e.reason}: {e.message}" for e in core.list_namespaced_event(ns).items]
    log = op.log()
    api.close()
    assert len(statuses) == 4 and events and log
    leaks = []
    for what, canary in canaries.items():
        for form in _forms(canary):
            if form in log:
                line = next(line for line in log.splitlines() if form in line)
                leaks.append(f"{what} in the operator log: {line[:300]}")
            leaks += [f"{what} in an Event: {e[:300]}" for e in events if form in e]
            leaks += [f"{what} in status of {n}" for n, s in statuses.items() if form in s]
    assert not leaks, "\n".join(leaks)
