"""A namespace's mesh label added after Ready reaches the InferenceService without a resync (the default: none)."""

from __future__ import annotations

import time

from arbiter_operator.api.models import isvc_name
from arbiter_operator.render.mesh import EXCLUDE_INBOUND
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get

ISVC = isvc_name("credit-limit", "1.0.0")


def _annotations(api, ns):
    isvc = get(api, "serving.kserve.io/v1beta1", "inferenceservices", ns, ISVC) or {}
    return ((isvc.get("spec") or {}).get("predictor") or {}).get("annotations") or {}


def test_mesh_label_added_after_ready_is_noticed(control_plane, namespace, api, operator_process, predictors):
    op = operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: condition(get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, "credit-limit") or {},
                                 "Ready")["status"] == "True", 90, "Ready")
    assert EXCLUDE_INBOUND not in _annotations(api, namespace)
    time.sleep(3)  # converged and quiet: what follows can only come from the namespace watch (no resync is set)
    quiet = len(op.log())

    core = client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}})
    eventually(lambda: _annotations(api, namespace).get(EXCLUDE_INBOUND) == "8080", 30,
               "the sidecar exclusion after the label was added")
    assert f"labels of namespace {namespace} changed" in op.log()[quiet:]

    core.patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": None}}})
    eventually(lambda: EXCLUDE_INBOUND not in _annotations(api, namespace), 30, "the exclusion gone with the label")
