"""Helpers for the cluster tests of the operator (tests/cluster/operator)."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
from collections.abc import Callable
from typing import Any

from arbiter_operator.kube.client import KubeError
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.examples import example  # noqa: F401  (re-exported: the operator tests take it from here)
from support.kubekit import raw_call
from support.paths import REPO
from support.polling import eventually as _eventually

ROOT = REPO
G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"


def create_dm(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, P, copy.deepcopy(body))


def rejection(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    """The apiserver's message for an invalid DecisionModel (fails the test if it was accepted)."""
    try:
        create_dm(api, namespace, body)
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return json.loads(exc.body)["message"]
    raise AssertionError("the apiserver accepted an invalid DecisionModel")


def get(api: client.ApiClient, api_version: str, kind_plural: str, namespace: str, name: str) -> dict | None:
    group, _, version = api_version.rpartition("/")
    try:
        if group:
            return client.CustomObjectsApi(api).get_namespaced_custom_object(group, version, namespace, kind_plural,
                                                                             name)
        return raw_call(api, "GET", f"/api/v1/namespaces/{namespace}/{kind_plural}/{name}")
    except (ApiException, KubeError) as exc:
        if exc.status == 404:
            return None
        raise


def eventually(fn: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
               context: Callable[[], str] | None = None) -> Any:
    """support.polling.eventually, retrying while the object is not there yet or half-written; `context`: appended to
    the timeout error (an operator's log tail)."""
    return _eventually(fn, timeout, what, ignoring=(AssertionError, KeyError, TypeError, ApiException), context=context)


def kubectl(kubeconfig: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True,
                          text=True, timeout=timeout)


def condition(dm: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (dm.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


MODEL_CONFIG = {
    # A Qwen3-shaped config small enough to upload in a test; the operator reads only these keys.
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "max_position_embeddings": 32768,
}


def seed_model_storage(s3: Any, api: client.ApiClient, namespace: str, prefixes: tuple[str, ...] = (
        "credit-limit/1.0.0", "credit-limit/1.1.0")) -> None:
    """Weights on the real S3 server where examples/ point (s3://models/...), and the storage-config Secret."""
    s3c = s3.client()
    with contextlib.suppress(s3c.exceptions.BucketAlreadyOwnedByYou):
        s3c.create_bucket(Bucket="models")
    for prefix in prefixes:
        s3c.put_object(Bucket="models", Key=f"{prefix}/config.json", Body=json.dumps(MODEL_CONFIG).encode())
        s3c.put_object(Bucket="models", Key=f"{prefix}/model.safetensors", Body=b"\0" * 64)
    entry = {"type": "s3", "access_key_id": s3.access_key, "secret_access_key": s3.secret_key,
             "endpoint_url": s3.endpoint_url, "region": s3.region, "verify_ssl": "0"}
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "storage-config"},
            "stringData": {"default": json.dumps(entry)}}
    client.CoreV1Api(api).create_namespaced_secret(namespace, body)
