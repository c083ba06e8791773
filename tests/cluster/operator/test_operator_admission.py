"""Refused at `oc apply`, not minutes later: the operator's validating webhook (kopf's server, the operator's checks)
on the real apiserver. What the CRD's CEL cannot see (a vLLM flag spelled as an argparse prefix, a schema that is not
JSON Schema, a schema nested past the operator's limit, KServe's host-name limit in this namespace) fails the apply
within a second, naming the field; a valid DecisionModel and an update that leaves the spec alone go through; with
the webhook away the documented policy (Ignore) admits, and the status refuses it as before."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from arbiter_devenv.operator_process import free_port
from arbiter_operator.kube.transport import auth_headers
from kubernetes import client
from kubernetes.client.rest import ApiException
from support import webhook_kit
from support.operator_kit import G, P, V, condition, create_dm, eventually, example, get, kubectl
from test_operator_deep_objects import deep_schema_body

# The predictor host is <name>--<version>-predictor-<namespace>, one DNS label: name + version <= 50 - len(namespace).
HOST_BUDGET = 50


@pytest.fixture
def webhook(operator_process: Any, api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Any]:
    """An operator serving its webhook on 127.0.0.1, and a configuration that sends it this namespace's requests."""
    port = free_port()
    ca = webhook_kit.serving_certificate(tmp_path / "tls")
    args = ("--webhook-port", str(port), "--webhook-cert-dir", str(tmp_path / "tls"), "--webhook-address", "127.0.0.1")
    name = f"arbiter-test-{namespace}"
    webhook_kit.install(api, webhook_kit.webhook_configuration(name, port, ca, namespace))

    class Served:
        def start(self) -> Any:
            self.op = operator_process(namespaces=[namespace], extra_args=args)
            # Served once a spec the webhook refuses is refused (the apiserver reads new configurations within ~1 s).
            eventually(lambda: refused(api, namespace, bad_flag_body("probe-" + uuid.uuid4().hex[:6])), 30,
                       "the webhook to answer")
            return self.op

    served = Served()
    served.start()
    try:
        yield served
    finally:
        webhook_kit.uninstall(api, name)


def body(name: str) -> dict[str, Any]:
    dm = copy.deepcopy(example())
    dm["metadata"]["name"] = name
    return dm


def bad_flag_body(name: str) -> dict[str, Any]:
    dm = body(name)
    # An argparse prefix of the managed --tensor-parallel-size: vLLM would read it as that flag; CEL sees no match.
    dm["spec"]["serving"]["vllm"]["extraArgs"] = ["--tensor-parallel", "4"]
    return dm


def refused(api: client.ApiClient, namespace: str, dm: dict[str, Any]) -> str:
    """The webhook's message for `dm` (fails the test if it was admitted or refused by anything else)."""
    try:
        create_dm(api, namespace, dm)
    except ApiException as exc:
        message = json.loads(exc.body)["message"]
        assert exc.status == 422 and "decisionmodels.arbiter.dev" in message and "denied the request" in message, \
            exc.body
        return str(message)
    raise AssertionError(f"DecisionModel {dm['metadata']['name']} was admitted")


def raw_create(api: client.ApiClient, namespace: str, data: bytes) -> tuple[int, dict[str, Any]]:
    config = api.configuration
    resp = api.rest_client.pool_manager.request(
        "POST", f"{config.host}/apis/{G}/{V}/namespaces/{namespace}/{P}", body=data,
        headers={"Content-Type": "application/json", "Accept": "application/json", **auth_headers(config)},
        preload_content=True, timeout=30)
    return resp.status, json.loads(resp.data)


def timed_refusal(api: client.ApiClient, namespace: str, dm: dict[str, Any]) -> str:
    started = time.monotonic()
    message = refused(api, namespace, dm)
    assert time.monotonic() - started < 1.0, f"the refusal took {time.monotonic() - started:.2f}s"
    assert get(api, f"{G}/{V}", P, namespace, dm["metadata"]["name"]) is None, "a refused DecisionModel was stored"
    return message


def test_what_cel_cannot_see_is_refused_at_apply_naming_the_field(webhook: Any, api: client.ApiClient,
                                                                  namespace: str, control_plane: Any,
                                                                  tmp_path: Path) -> None:
    assert "extraArgs" in timed_refusal(api, namespace, bad_flag_body("flag-prefix"))
    fp8_on_v100 = body("fp8-on-v100")
    fp8_on_v100["spec"]["serving"].update(gpuProduct="Tesla-V100-SXM2-16GB", vllm={"quantization": "fp8"})
    assert "quantization fp8 cannot run on Tesla-V100-SXM2-16GB (compute capability 7.0)" in timed_refusal(
        api, namespace, fp8_on_v100)
    not_schema = body("not-a-schema")
    not_schema["spec"]["versions"][0]["metadata"]["outputSchema"] = {"type": "object", "properties": {"x": {"type": 5}}}
    assert "metadata.outputSchema is not a valid JSON Schema" in timed_refusal(api, namespace, not_schema)
    for wraps, says in ((35, "outputSchema: Value error, nested deeper than 64 levels"),  # 71 levels: the field
                        (200, "nested deeper than 128 levels")):  # refused unread, the limit named
        deep = body(f"deep-schema-{wraps}")
        schema: dict[str, Any] = {"type": "object"}
        for _ in range(wraps):  # two levels each; the apiserver admits both
            schema = {"type": "object", "properties": {"x": schema}}
        deep["spec"]["versions"][0]["metadata"]["outputSchema"] = schema
        assert says in timed_refusal(api, namespace, deep)
    # 1,201 levels, past orjson's decoder too (and Python's json: sent as bytes): refused, the limits named.
    started = time.monotonic()
    status, answer = raw_create(api, namespace, deep_schema_body("deep-schema-600", 1_201))
    assert status == 422 and "nested deeper than 1,024 levels is never decoded" in answer["message"], answer
    assert time.monotonic() - started < 1.0
    # `kubectl apply` shows the same message to the user who applied it, and stores nothing.
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad_flag_body("via-kubectl")))
    out = kubectl(control_plane.kubeconfig, "-n", namespace, "apply", "-f", str(path))
    assert out.returncode != 0 and "extraArgs" in out.stderr and "denied the request" in out.stderr, out.stderr
    assert get(api, f"{G}/{V}", P, namespace, "via-kubectl") is None


def test_the_host_name_limit_holds_at_the_exact_boundary_of_this_namespace(webhook: Any, api: client.ApiClient,
                                                                           namespace: str) -> None:
    limit = HOST_BUDGET - len(namespace)
    version = body("x")["spec"]["versions"][0]["name"]
    at = body("m" * (limit - len(version)))
    over = body("m" * (limit - len(version) + 1))
    for dm in (at, over):
        dm["spec"]["exposure"] = {**dm["spec"].get("exposure", {}), "host": "decide.apps.example.com"}
    create_dm(api, namespace, at)
    message = timed_refusal(api, namespace, over)
    assert f"may be at most {limit} characters" in message and namespace in message


def test_valid_specs_and_spec_preserving_updates_go_through(webhook: Any, api: client.ApiClient,
                                                            namespace: str) -> None:
    created = create_dm(api, namespace, body("credit-limit"))
    assert created["metadata"]["name"] == "credit-limit"
    patch = {"metadata": {"labels": {"team": "risk"}}}
    client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, namespace, P, "credit-limit", patch)
    bad = {"spec": {"serving": {"vllm": {"extraArgs": ["--tensor-parallel", "4"]}}}}
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, namespace, P, "credit-limit", bad)
    assert err.value.status == 422 and "extraArgs" in err.value.body


def test_with_the_webhook_away_the_apply_goes_through_and_the_status_refuses_it(webhook: Any, api: client.ApiClient,
                                                                               namespace: str) -> None:
    webhook.op.stop()
    started = time.monotonic()
    create_dm(api, namespace, bad_flag_body("while-away"))  # failurePolicy Ignore: admitted
    assert time.monotonic() - started < 6.0  # at most the webhook's 5 s timeout
    webhook.start()
    dm = eventually(lambda: get(api, f"{G}/{V}", P, namespace, "while-away"), 10)

    def stalled() -> dict[str, Any]:
        got = get(api, f"{G}/{V}", P, namespace, "while-away")
        cond = condition(got or dm, "Stalled")
        assert cond and cond["status"] == "True" and cond["reason"] == "InvalidSpec", cond
        return cond

    assert "extraArgs" in eventually(stalled, 60, "the status to refuse it")["message"]
    # Admitted while the webhook was away, it can still be labelled (and so finalized and deleted).
    client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, namespace, P, "while-away",
                                                                {"metadata": {"labels": {"seen": "yes"}}})
    client.CustomObjectsApi(api).delete_namespaced_custom_object(G, V, namespace, P, "while-away")

