"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver (v1.34 serves admissionregistration.k8s.io/v1):
a DecisionModel whose name plus a version's name exceeds 50 - len(namespace), the most KServe's predictor host label
allows, is refused at `oc apply` with a message naming the field and this namespace's limit; one character less is
accepted. Checked at the exact boundary in namespaces of several lengths, against the operator's own limit
(plan/validate.py), so the chart's CEL and the operator's check refuse the same DecisionModels."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
from arbiter_operator.api.models import DecisionModel, name_plus_version_limit
from arbiter_operator.plan.validate import host_label_problems
from kubernetes import client
from support.chartkit import of_kind, render
from support.examples import example
from support.kubekit import delete_quietly, dynamic_client, server_side_apply
from support.polling import eventually

pytestmark = pytest.mark.cluster


def _namespace(core: client.CoreV1Api, length: int) -> str:
    name = f"h{uuid.uuid4().hex}"[:length - 1] + "x"
    name = (name + "y" * length)[:length]
    core.create_namespace({"metadata": {"name": name, "labels": {"arbiter.dev/test": "true"}}})
    return name


def _body(namespace: str, name: str, version: str) -> dict[str, Any]:
    body = copy.deepcopy(example())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["versions"] = [{**body["spec"]["versions"][0], "name": version}]
    body["spec"]["promote"] = {"version": version}
    return body


def _operator_refuses(namespace: str, name: str, version: str) -> bool:
    return bool(host_label_problems(DecisionModel.model_validate(_body(namespace, name, version))))


def _create(api: Any, namespace: str, name: str, version: str) -> str | None:
    """None when a dry-run create is admitted; else the apiserver's message."""
    body = _body(namespace, name, version)
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "arbiter.dev", "v1alpha1", namespace, "decisionmodels", body, dry_run="All")
    except client.ApiException as exc:
        return str(json.loads(exc.body).get("message"))
    return None


def test_the_policy_refuses_exactly_what_kserve_would_per_namespace_length(control_plane):
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    dyn = dynamic_client(api)
    docs = [d for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
            for d in of_kind(render(), kind)]
    assert len(docs) == 2
    namespaces: list[str] = []
    try:
        for doc in docs:
            server_side_apply(dyn, doc)
        namespaces = [_namespace(core, n) for n in (8, 20, 34)]
        first = namespaces[0]
        # The policy is enforced once the apiserver has loaded it.
        eventually(lambda: _create(api, first, "m" * 30, "1" * 13) is not None, 30, "the policy enforced")
        for ns in namespaces:
            limit = name_plus_version_limit(ns)
            assert limit == 50 - len(ns)
            version = "1.0.0"
            fits = "m" * (limit - len(version))
            assert _create(api, ns, fits, version) is None, (ns, limit)
            assert not _operator_refuses(ns, fits, version) and _operator_refuses(ns, fits + "m", version)
            refused = _create(api, ns, fits + "m", version)
            assert refused is not None, (ns, limit)
            assert "spec.versions" in refused and f"in namespace {ns}" in refused, refused
            assert f"at most {limit} characters" in refused and "-predictor-" in refused, refused
    finally:
        for ns in namespaces:
            core.delete_namespace(ns, propagation_policy="Background")
        for doc in reversed(docs):
            delete_quietly(dyn, doc)
        api.close()
