"""Talking to the real apiserver the way `kubectl apply --server-side` does."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from arbiter_operator.kube.client import answer_of
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from support.polling import eventually

FIELD_MANAGER = "arbiter-chart-test"


def dynamic_client(api_client: client.ApiClient) -> dynamic.DynamicClient:
    return dynamic.DynamicClient(api_client)


def server_side_apply(
    dyn: dynamic.DynamicClient, obj: Mapping[str, Any], *, dry_run: bool = False, manager: str = FIELD_MANAGER
) -> dict[str, Any]:
    """PATCH application/apply-patch+yaml, force on conflicts (what helm and Argo CD's ServerSideApply do)."""
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs: dict[str, Any] = {}
    if dry_run:
        kwargs["dry_run"] = "All"
    result = resource.server_side_apply(
        body=dict(obj),
        name=obj["metadata"]["name"],
        namespace=obj["metadata"].get("namespace") if resource.namespaced else None,
        field_manager=manager,
        force_conflicts=True,
        **kwargs,
    )
    return result.to_dict()


def delete_quietly(dyn: dynamic.DynamicClient, obj: Mapping[str, Any]) -> None:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.delete(
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace") if resource.namespaced else None,
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def wait_established(api_client: client.ApiClient, name: str, timeout: float = 60.0) -> None:
    ext = client.ApiextensionsV1Api(api_client)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        return {c.type: c.status for c in (crd.status.conditions or [])}.get("Established") == "True"

    eventually(established, timeout, f"CRD {name} Established", interval=0.2)


def api_error(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message", exc.body)
    except (TypeError, ValueError):
        return str(exc.body)


def raw_call(api: client.ApiClient, method: str, path: str, body: Any = None,
             query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
             timeout: float = 30.0) -> dict[str, Any]:
    """One blocking REST call of the test's own (another writer or reader than the operator) through the kubernetes
    client: the decoded JSON object, or the operator's KubeError for a non-2xx answer (its decoding of answers)."""
    method_, url, headers, body_, post = api.param_serialize(
        method, path, query_params=query or [],
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body, auth_settings=["BearerToken"])
    resp = api.call_api(method_, url, header_params=headers, body=body_, post_params=post, _request_timeout=timeout)
    return answer_of(method, path, resp.status, resp.reason or "", resp.read())
