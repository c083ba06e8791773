"""One bad object never stops the fleet, on the real apiserver: it admits a DecisionModel whose outputSchema nests
600, 1,100 or 3,000 levels deep (x-kubernetes-preserve-unknown-fields; its JSON decoder goes to 10,000). The operator
refuses each on its status (Stalled, InvalidSpec, a message naming the limit) instead of failing its namespace's list,
and after a restart a DecisionModel in another namespace still becomes Ready."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_operator.kube.transport import auth_headers
from kubernetes import client
from support.operator_kit import G, P, V, create_dm, eventually, example, get, kubectl

DEPTHS = (600, 1_100, 3_000)
PLACEHOLDER = '"@@schema@@"'


@pytest.fixture
def second_namespace(api: client.ApiClient) -> Iterator[str]:
    """Another fresh namespace (it holds only the bad DecisionModels: no pods, so no ServiceAccount to wait for)."""
    core = client.CoreV1Api(api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name,
                                                                         labels={"arbiter.dev/test": "true"})))
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def deep_schema_body(name: str, levels: int) -> bytes:
    """The example DecisionModel, its outputSchema nested `levels` deep (bytes: Python's json module nests less)."""
    body = example()
    body["metadata"]["name"] = name
    body["spec"]["versions"][0]["metadata"]["outputSchema"] = "@@schema@@"
    schema = '{"type":"object","properties":{"x":' * ((levels - 1) // 2) + '{"type":"object"}' + \
        "}}" * ((levels - 1) // 2)
    return json.dumps(body).replace(PLACEHOLDER, schema).encode()


def post(api: client.ApiClient, namespace: str, data: bytes) -> float:
    """Create a DecisionModel from raw JSON bytes; the seconds the apiserver took to admit it."""
    config = api.configuration
    started = time.monotonic()
    resp = api.rest_client.pool_manager.request(
        "POST", f"{config.host}/apis/{G}/{V}/namespaces/{namespace}/{P}", body=data,
        headers={"Content-Type": "application/json", "Accept": "application/json", **auth_headers(config)},
        preload_content=True, timeout=30)
    assert resp.status == 201, resp.data[:500]
    return time.monotonic() - started


def status_of(kubeconfig: str, namespace: str, name: str) -> dict[str, Any]:
    """The status as kubectl reads it (Go's decoder reads what the operator's refuses)."""
    out = kubectl(kubeconfig, "-n", namespace, "get", f"{P}.{G}", name, "-o", "jsonpath={.status}")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout or "{}")


def refused(kubeconfig: str, namespace: str, name: str) -> dict[str, str] | None:
    status = status_of(kubeconfig, namespace, name)
    conds = {c["type"]: c for c in status.get("conditions") or []}
    stalled, ready = conds.get("Stalled"), conds.get("Ready")
    if not (stalled and ready and stalled["status"] == "True" and ready["status"] == "False"):
        return None
    assert stalled["reason"] == ready["reason"] == "InvalidSpec"
    return ready


def ready(api: client.ApiClient, namespace: str) -> bool:
    dm = get(api, f"{G}/{V}", P, namespace, "credit-limit")
    conds = {c["type"]: c for c in ((dm or {}).get("status") or {}).get("conditions") or []}
    return bool(conds.get("Ready") and conds["Ready"]["status"] == "True")


def test_deep_schemas_are_refused_on_their_status_and_never_stop_the_others(
        control_plane, namespace, second_namespace, api, operator_process, predictors):
    bad = second_namespace
    admitted = {levels: post(api, bad, deep_schema_body(f"deep-{levels}", levels)) for levels in DEPTHS}
    print(f"apiserver admission seconds by depth: {admitted}")

    op = operator_process(namespaces=[namespace, bad])
    started = time.monotonic()
    for levels in DEPTHS:
        ready_cond = eventually(lambda lv=levels: refused(control_plane.kubeconfig, bad, f"deep-{lv}"), 90,
                                f"deep-{levels} refused on its status", context=lambda: op.log()[-6000:])
        assert "64 levels" in ready_cond["message"], ready_cond["message"]  # the limit a user can act on
    print(f"every deep DecisionModel refused {time.monotonic() - started:.1f}s after the operator started")
    op.stop()

    # A fresh operator lists that namespace again (a page holding objects it cannot decode) and still works.
    again = operator_process(namespaces=[namespace, bad])
    started = time.monotonic()
    create_dm(api, namespace, example())
    eventually(lambda: ready(api, namespace), 120, "the other namespace's DecisionModel Ready after the restart",
               context=lambda: again.log()[-6000:])
    print(f"Ready {time.monotonic() - started:.1f}s after the restart")
    for levels in DEPTHS:
        assert refused(control_plane.kubeconfig, bad, f"deep-{levels}") is not None
