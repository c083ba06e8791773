"""The operator on the real apiserver: from `kubectl apply` to Ready, zero writes when converged, drift restored."""

from __future__ import annotations

import json
import time

from arbiter_operator.api.names import FIELD_MANAGER
from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get, kubectl

DM = "credit-limit"
ISVC = "credit-limit--1-0-0"


def _dm(api, ns):
    return get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM)


def _ready(api, ns):
    dm = _dm(api, ns)
    c = condition(dm, "Ready")
    return dm if c and c["status"] == "True" and dm["status"]["observedGeneration"] == dm["metadata"]["generation"] \
        else None


def _versions(api, ns) -> dict[str, str]:
    objs = {
        "dm": _dm(api, ns),
        "isvc": get(api, "serving.kserve.io/v1beta1", "inferenceservices", ns, ISVC),
        "runtime": get(api, "serving.kserve.io/v1alpha1", "servingruntimes", ns, "credit-limit-runtime"),
        "route": get(api, "route.openshift.io/v1", "routes", ns, DM),
        "configmap": get(api, "v1", "configmaps", ns, "credit-limit--1-0-0-decision"),
        "podmonitor": get(api, "monitoring.coreos.com/v1", "podmonitors", ns, DM),
    }
    return {k: o["metadata"]["resourceVersion"] for k, o in objs.items()}


def test_apply_example_to_ready(control_plane, namespace, api, operator_process, predictors):
    operator_process(namespaces=[namespace])
    applied = kubectl(control_plane.kubeconfig, "-n", namespace, "apply", "-f", "examples/decisionmodel.yaml")
    assert applied.returncode == 0, applied.stderr

    waited = kubectl(control_plane.kubeconfig, "-n", namespace, "wait", "--for=condition=Ready", f"dm/{DM}",
                     "--timeout=90s")
    assert waited.returncode == 0, waited.stderr + json.dumps(_dm(api, namespace).get("status"), indent=1)

    isvc = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC)
    pred = isvc["spec"]["predictor"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert pred["model"]["modelFormat"]["name"] == "vLLM"
    assert pred["model"]["runtime"] == "credit-limit-runtime"
    assert pred["model"]["storage"]["path"] == "credit-limit/1.0.0"
    assert pred["model"]["storage"]["parameters"] == {"type": "s3", "bucket": "models"}
    assert pred["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "--tensor-parallel-size=1" in pred["model"]["args"]
    assert "nodeSelector" not in pred  # no GPU product pinned unless spec.serving.gpuProduct names one
    dm = _dm(api, namespace)
    owner = isvc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("DecisionModel", dm["metadata"]["uid"])

    runtime = get(api, "serving.kserve.io/v1alpha1", "servingruntimes", namespace, "credit-limit-runtime")
    assert runtime["spec"]["supportedModelFormats"][0]["name"] == "vLLM"
    cm = get(api, "v1", "configmaps", namespace, "credit-limit--1-0-0-decision")
    assert json.loads(cm["data"]["decision.json"])["labels"] == ["approved", "rejected", "review"]
    route = get(api, "route.openshift.io/v1", "routes", namespace, DM)
    assert route["spec"]["to"] == {"kind": "Service", "name": f"{ISVC}-predictor", "weight": 100}
    assert get(api, "v1", "services", namespace, f"{ISVC}-predictor")  # the Service the Route targets exists
    assert route["spec"]["tls"] == {"termination": "reencrypt", "insecureEdgeTerminationPolicy": "Redirect"}
    assert route["metadata"]["annotations"]["haproxy.router.openshift.io/timeout"] == "30s"

    # Prometheus (OpenShift user-workload monitoring) scrapes the predictors with version-labelled targets, which
    # the promotion analysis selects by.
    pm = get(api, "monitoring.coreos.com/v1", "podmonitors", namespace, DM)
    assert pm["metadata"]["ownerReferences"][0]["uid"] == dm["metadata"]["uid"]
    assert pm["spec"]["selector"] == {"matchLabels": {"arbiter.dev/decision-model": DM}}
    assert pm["spec"]["podTargetLabels"] == ["arbiter.dev/decision-model", "arbiter.dev/version"]
    # Auth on (the example's default): the runtime wants a token for its metrics too, from the metrics-reader Secret.
    bearer = {"type": "Bearer", "credentials": {"name": "arbiter-metrics-reader", "key": "token"}}
    assert pm["spec"]["podMetricsEndpoints"] == [
        {"port": "http1", "path": "/metrics", "scheme": "http", "authorization": bearer},
        {"port": "http1", "path": "/metrics/vllm", "scheme": "http", "authorization": bearer,
         "relabelings": [{"action": "replace", "targetLabel": "endpoint", "replacement": "vllm"}]}]
    assert runtime["spec"]["containers"][0]["ports"][0] == {"containerPort": 8080, "name": "http1", "protocol": "TCP"}

    status = dm["status"]
    assert status["activeVersion"] == "1.0.0"
    assert status["versions"][0]["phase"] == "Ready"
    assert status["promotion"]["stable"] == "1.0.0"
    for c in status["conditions"]:
        assert c["observedGeneration"] == dm["metadata"]["generation"]
    assert condition(dm, "Serving")["status"] == "True"
    assert condition(dm, "Stalled")["status"] == "False"

    listed = kubectl(control_plane.kubeconfig, "-n", namespace, "get", "dm")
    assert "1.0.0" in listed.stdout and "True" in listed.stdout  # printer columns Active, Ready

    events = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={DM}")
    reasons = {e.reason for e in events.items}
    # Ready once, and it stays: the first version's pods are not rolled again by a second write (KServe's rewrite of
    # the deployment mode's name is not a change), so the model never reads NotReady after Ready.
    assert "Ready" in reasons and "NotReady" not in reasons, reasons
    sets = client.AppsV1Api(api).list_namespaced_replica_set(
        namespace, label_selector=f"serving.kserve.io/inferenceservice={ISVC}")
    assert len(sets.items) == 1, [r.metadata.name for r in sets.items]


def test_converged_reconcile_writes_nothing_and_drift_is_restored(
    control_plane, namespace, api, operator_process, predictors
):
    op = operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 90, "Ready")
    settled = lambda: (d := _ready(api, namespace)) and condition(d, "Exposed")["status"] == "True" and \
        condition(d, "Reconciling")["status"] == "False"  # noqa: E731
    eventually(settled, 30, "converged")
    time.sleep(1)
    op.stop()
    before = _versions(api, namespace)

    # A fresh operator reconciles everything on start; the world already matches, so it must write nothing.
    again = operator_process(namespaces=[namespace])
    eventually(lambda: f"reconciled {namespace}/{DM}" in again.log(), 30, "the restarted operator's reconcile")
    time.sleep(2)  # let any late write show up in the log
    assert again.writes() == [], "\n".join(again.writes())  # our client's write calls, counted
    assert f"reconciled {namespace}/{DM}: 0 writes" in again.log()
    # ...and nothing else (kopf included) wrote to the DecisionModel or its children: no resourceVersion moved.
    assert _versions(api, namespace) == before

    custom = client.CustomObjectsApi(api)
    # Deleted children come back.
    custom.delete_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", ISVC)
    custom.delete_namespaced_custom_object("route.openshift.io", "v1", namespace, "routes", DM)
    client.CoreV1Api(api).delete_namespaced_config_map("credit-limit--1-0-0-decision", namespace)
    eventually(lambda: get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC), 30, "ISVC back")
    eventually(lambda: get(api, "v1", "configmaps", namespace, "credit-limit--1-0-0-decision"), 30, "ConfigMap back")
    eventually(lambda: _ready(api, namespace), 30, "Ready again")
    eventually(lambda: get(api, "route.openshift.io/v1", "routes", namespace, DM), 30, "Route back")

    # An edited child is put back.
    custom.patch_namespaced_custom_object(
        "route.openshift.io", "v1", namespace, "routes", DM,
        {"spec": {"to": {"kind": "Service", "name": "somewhere-else", "weight": 100}}},
    )
    eventually(
        lambda: get(api, "route.openshift.io/v1", "routes", namespace, DM)["spec"]["to"]["name"] == f"{ISVC}-predictor",
        30, "Route restored",
    )
    # The operator never writes spec.
    assert _dm(api, namespace)["metadata"]["generation"] == 1


def test_mesh_auto_excludes_serving_port_in_injected_namespace(
    control_plane, namespace, api, operator_process, predictors
):
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}})
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    isvc = eventually(lambda: get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC), 60, "ISVC")
    assert isvc["spec"]["predictor"]["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"] == "8080"


def _as_the_operator_wrote(obj: dict) -> tuple:
    meta = obj["metadata"]
    own = [(m.get("operation"), m.get("time")) for m in meta.get("managedFields") or []
           if m.get("manager") == FIELD_MANAGER]
    return meta.get("generation"), meta.get("labels"), meta.get("annotations"), obj.get("spec"), own


def test_operator_side_invalid_spec_stalls_without_touching_serving(
    control_plane, namespace, api, operator_process, predictors
):
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 90, "Ready")
    before = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC)

    rules = example()["spec"]["decision"]["fallbackRules"]
    rules[0]["when"] = "input.requestedLimit >"  # not CEL: only the operator can tell
    rules[0]["decision"] = "rejected"
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM, {"spec": {"decision": {"fallbackRules": rules}}}
    )

    def stalled():
        dm = _dm(api, namespace)
        c = condition(dm, "Stalled")
        return dm if c and c["status"] == "True" and c["observedGeneration"] == 2 else None

    dm = eventually(stalled, 30, "Stalled=True")
    assert condition(dm, "Stalled")["reason"] == "InvalidSpec"
    assert "not valid CEL" in condition(dm, "Stalled")["message"]
    assert condition(dm, "Ready")["status"] == "False"
    after = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC)
    # Untouched by the operator: what it writes (spec, labels, annotations) and its field manager's last write are as
    # before. KServe may still be writing the status it owns, so the resourceVersion is no measure of that.
    assert _as_the_operator_wrote(after) == _as_the_operator_wrote(before)
    cm = get(api, "v1", "configmaps", namespace, "credit-limit--1-0-0-decision")
    assert json.loads(cm["data"]["decision.json"])["fallbackRules"][0]["decision"] == "review"


def test_changed_decision_settings_update_the_configmap_and_roll_the_pods(
    control_plane, namespace, api, operator_process, predictors
):
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 90, "Ready")
    key = "arbiter.dev/decision-config-checksum"
    before = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC)
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM, {"spec": {"decision": {"confidenceThreshold": 0.9}}}
    )
    eventually(
        lambda: json.loads(get(api, "v1", "configmaps", namespace, "credit-limit--1-0-0-decision")["data"]
                           ["decision.json"])["confidenceThreshold"] == 0.9,
        30, "ConfigMap updated",
    )
    after = eventually(
        lambda: (i := get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC))["spec"]["predictor"]
        ["annotations"][key] != before["spec"]["predictor"]["annotations"][key] and i,
        30, "pod template annotation changed",
    )
    assert after["spec"]["predictor"]["model"]["storage"] == before["spec"]["predictor"]["model"]["storage"]


def test_failed_inferenceservice_is_reported_and_recovery_noticed(
    control_plane, namespace, api, operator_process, predictors
):
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 90, "Ready")
    predictors.set_fate(ISVC, "crashloop")  # the serving container exits with code 1 at load, again and again

    def failed():
        dm = _dm(api, namespace)
        serving = condition(dm, "Serving")
        return dm if serving and serving["status"] == "False" and dm["status"]["versions"][0]["phase"] == "Failed" \
            else None

    dm = eventually(failed, 60, "Serving=False and the version Failed")
    # The cause as the pods show it: reason, pod, restart count, last exit.
    serving = condition(dm, "Serving")
    assert serving["reason"] == "CrashLoopBackOff", serving
    assert condition(dm, "Ready")["status"] == "False"
    message = dm["status"]["versions"][0]["message"]
    assert f"{ISVC}-predictor-" in message and "container kserve-container restarted" in message, message
    assert "last exit Error (exit code 1)" in message, message
    # The Route is not pointed at nothing: it stays where it was.
    assert get(api, "route.openshift.io/v1", "routes", namespace, DM)["spec"]["to"]["name"] == f"{ISVC}-predictor"

    predictors.set_fate(ISVC, "ready")
    eventually(lambda: _ready(api, namespace), 60, "Ready again")
    events = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={DM}")
    assert "NotReady" in {e.reason for e in events.items}


def test_removed_stable_version_serves_until_its_successor_does(
    control_plane, namespace, api, operator_process, predictors
):
    """Nothing is lost: the serving version removed from spec.versions keeps its InferenceService and all traffic
    until the version spec.promote names is ready; then it is stopped."""
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 90, "Ready")
    custom = client.CustomObjectsApi(api)
    predictors.set_fate("credit-limit--1-1-0", "loading")  # the successor loads until the test says otherwise

    dm = _dm(api, namespace)
    spec = dm["spec"]
    spec["versions"][0].update(name="1.1.0", storageUri="s3://models/credit-limit/1.1.0")
    spec["promote"] = {"version": "1.1.0", "strategy": "Immediate", "rollbackWindowSeconds": 0}
    custom.replace_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM, dm)

    def successor_loading():
        d = _dm(api, namespace)
        new = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, "credit-limit--1-1-0")
        return d if new and d["status"]["observedGeneration"] == 2 and d["status"]["promotion"]["phase"] == "Waiting" \
            else None

    dm = eventually(successor_loading, 60, "1.1.0 deployed and loading")
    assert get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC), "serving version torn down"
    assert get(api, "v1", "configmaps", namespace, "credit-limit--1-0-0-decision")
    assert get(api, "route.openshift.io/v1", "routes", namespace, DM)["spec"]["to"]["name"] == f"{ISVC}-predictor"
    serving = condition(dm, "Serving")
    assert serving["status"] == "True", serving
    assert "1.0.0 left spec.versions" in serving["message"] and "stopped once 1.1.0" in serving["message"], serving
    old = next(v for v in dm["status"]["versions"] if v["name"] == "1.0.0")
    assert old["phase"] == "Ready" and "left spec.versions" in old["message"]

    predictors.set_fate("credit-limit--1-1-0", "ready")

    def switched():
        d = _ready(api, namespace)
        return d if d and d["status"]["activeVersion"] == "1.1.0" else None

    eventually(switched, 60, "1.1.0 promoted")
    eventually(lambda: get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, ISVC) is None, 30,
               "1.0.0 stopped")
    route = get(api, "route.openshift.io/v1", "routes", namespace, DM)
    assert route["spec"]["to"]["name"] == "credit-limit--1-1-0-predictor"
