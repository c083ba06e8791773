"""Status never lies, an outage is not a verdict, on the real stack (KServe v0.17's controller and webhooks, the
ReplicaSet controller, kwok's A100 nodes): KServe's webhook server stopped while a candidate's pods are being
recreated holds the promotion, which completes once KServe is back; a write the apiserver refuses shows on the
DecisionModel within the pass, with one Warning Event."""

from __future__ import annotations

import copy
import os
import signal
import time
from typing import Any

from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"
V1_ISVC, V2_ISVC = "credit-limit--1-0-0", "credit-limit--1-1-0"
ISVC_API = "serving.kserve.io/v1beta1"
OUTAGE_SECONDS = 60


def _dm(api: Any, ns: str) -> dict[str, Any]:
    return get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM) or {}


def _ready_on(api: Any, ns: str, version: str) -> dict[str, Any] | None:
    d = _dm(api, ns)
    c = condition(d, "Ready") or {}
    fresh = (d.get("status") or {}).get("observedGeneration") == d.get("metadata", {}).get("generation")
    return d if fresh and c.get("status") == "True" and d["status"].get("activeVersion") == version else None


def _promote_v2(api: Any, ns: str, **promote: Any) -> None:
    dm = _dm(api, ns)
    v2 = copy.deepcopy(dm["spec"]["versions"][0])
    v2.update(name="1.1.0", storageUri="s3://models/credit-limit/1.1.0")
    dm["spec"]["versions"].append(v2)
    dm["spec"]["promote"] = {"version": "1.1.0", "strategy": "Immediate", "rollbackWindowSeconds": 0, **promote}
    client.CustomObjectsApi(api).replace_namespaced_custom_object("arbiter.dev", "v1alpha1", ns, "decisionmodels",
                                                                  DM, dm)


def _uid(api: Any, api_version: str, plural: str, ns: str, name: str) -> str | None:
    obj = get(api, api_version, plural, ns, name)
    return obj["metadata"]["uid"] if obj else None


def _warnings(api: Any, ns: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={DM}").items:
        if e.type == "Warning":
            out.setdefault(e.reason, []).append(e.message)
    return out


def test_kserve_webhooks_down_while_candidate_pods_are_recreated_hold_the_promotion_which_completes_after(
    control_plane, namespace, api, operator_process, predictors
):
    kserve = control_plane.kserve
    assert kserve is not None and kserve.pid, "this test stops the local KServe controller's webhook server"
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready_on(api, namespace, "1.0.0"), 90, "1.0.0 Ready")
    predictors.set_fate(V2_ISVC, "loading")  # the candidate's pods run but do not turn ready until the outage
    _promote_v2(api, namespace)

    def loading():
        d = _dm(api, namespace)
        pods = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"serving.kserve.io/inferenceservice={V2_ISVC}").items
        return d if pods and d["status"]["promotion"]["phase"] == "Waiting" else None

    eventually(loading, 90, "1.1.0 deployed, its pods loading")
    isvc_uid = _uid(api, ISVC_API, "inferenceservices", namespace, V2_ISVC)
    cm_uid = _uid(api, "v1", "configmaps", namespace, f"{V2_ISVC}-decision")
    assert isvc_uid and cm_uid

    os.kill(kserve.pid, signal.SIGSTOP)  # KServe's webhooks no longer answer (the apiserver's calls time out)
    try:
        stopped = time.monotonic()
        predictors.set_fate(V2_ISVC, "ready")  # deletes the loading pods: their ReplicaSet must create new ones
        held = eventually(lambda: (c := condition(_dm(api, namespace), "Reconciling")) and
                          c["reason"] == "WebhookUnavailable" and _dm(api, namespace), 60,
                          "Reconciling=True/WebhookUnavailable")
        rec = condition(held, "Reconciling")
        assert rec["status"] == "True" and "failed calling webhook" in rec["message"], rec
        assert "progress deadline" in rec["message"], rec
        while time.monotonic() - stopped < OUTAGE_SECONDS:  # every pass during the outage holds
            d = _dm(api, namespace)
            p = d["status"]["promotion"]
            assert p["phase"] == "Waiting" and not p.get("failureReason"), p
            assert (condition(d, "Stalled") or {}).get("status") != "True", d["status"]["conditions"]
            assert _uid(api, ISVC_API, "inferenceservices", namespace, V2_ISVC) == isvc_uid
            time.sleep(3)
    finally:
        os.kill(kserve.pid, signal.SIGCONT)

    done = eventually(lambda: _ready_on(api, namespace, "1.1.0"), 180, "1.1.0 promoted once KServe is back")
    assert done["status"]["promotion"]["history"][-1]["outcome"] == "Succeeded", done["status"]["promotion"]
    # The very candidate that was held serves: never deleted and recreated.
    assert _uid(api, ISVC_API, "inferenceservices", namespace, V2_ISVC) == isvc_uid
    assert _uid(api, "v1", "configmaps", namespace, f"{V2_ISVC}-decision") == cm_uid
    assert "CandidateFailed" not in _warnings(api, namespace)


def _refuse_candidate(api: Any, ns: str) -> str:
    """A ValidatingAdmissionPolicy (and its binding, for this namespace only) that refuses the candidate's
    InferenceService: a real refusal by the apiserver. Returns the name of both."""
    name = f"refuse-candidate-{ns}"
    adm = client.AdmissionregistrationV1Api(api)
    adm.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["serving.kserve.io"], "apiVersions": ["*"],
                                                         "operations": ["CREATE", "UPDATE"],
                                                         "resources": ["inferenceservices"]}]},
                 "validations": [{"expression": f"object.metadata.name != '{V2_ISVC}'",
                                  "message": "1.1.0 is frozen by the platform team"}]}})
    adm.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}})
    # The policy is enforced once the apiserver has loaded it: a dry run of the very object tells when.
    probe = copy.deepcopy(get(api, ISVC_API, "inferenceservices", ns, V1_ISVC))
    probe["metadata"] = {"name": V2_ISVC, "namespace": ns, "labels": probe["metadata"].get("labels") or {}}
    probe.pop("status", None)

    def enforced() -> bool:
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "serving.kserve.io", "v1beta1", ns, "inferenceservices", probe, dry_run="All")
        except client.ApiException as exc:
            return "frozen by the platform team" in (exc.body or "")
        return False

    eventually(enforced, 30, "the policy enforced")
    return name


def test_a_refused_candidate_write_shows_on_the_decisionmodel_within_the_pass(
    control_plane, namespace, api, operator_process, predictors
):
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready_on(api, namespace, "1.0.0"), 90, "1.0.0 Ready")
    policy = _refuse_candidate(api, namespace)
    adm = client.AdmissionregistrationV1Api(api)
    try:
        _promote_v2(api, namespace)

        def refused():
            d = _dm(api, namespace)
            c = condition(d, "Reconciling") or {}
            return d if d["status"]["observedGeneration"] == 2 and c.get("reason") == "ChildWriteRefused" else None

        d = eventually(refused, 60, "Reconciling=True/ChildWriteRefused")
        rec = condition(d, "Reconciling")
        assert rec["status"] == "True", rec
        assert f"InferenceService {namespace}/{V2_ISVC}" in rec["message"], rec
        assert "frozen by the platform team" in rec["message"], rec  # the apiserver's own words
        assert d["status"]["promotion"]["phase"] == "Waiting", d["status"]["promotion"]
        serving = condition(d, "Serving")
        assert serving["status"] == "True" and "1.0.0 100%" in serving["message"], serving  # 1.0.0 serves on
        events = eventually(lambda: (w := _warnings(api, namespace)).get("ChildWriteRefused") and w, 30,
                            "a ChildWriteRefused Event")
        assert len(events["ChildWriteRefused"]) == 1, events  # one Event; repeats are counted into it
        assert "frozen by the platform team" in events["ChildWriteRefused"][0]
    finally:
        adm.delete_validating_admission_policy_binding(policy)
        adm.delete_validating_admission_policy(policy)
    # The policy gone, the operator's next look (within a minute) creates the candidate.
    eventually(lambda: get(api, ISVC_API, "inferenceservices", namespace, V2_ISVC), 90, "1.1.0 created")
