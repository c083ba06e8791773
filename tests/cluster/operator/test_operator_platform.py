"""What OpenShift AI and in-cluster clients see of a DecisionModel, on the real apiserver: dashboard labels on the
InferenceService and ServingRuntime, the Route re-encrypting to the platform's proxy port, the stable Service that
follows the stable version through a promotion, and its address in status."""

from __future__ import annotations

import copy

from kubernetes import client
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"


def _dm(api, ns):
    return get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM)


def _ready_at(api, ns, version):
    dm = _dm(api, ns)
    c = condition(dm or {}, "Ready")
    ok = c and c["status"] == "True" and dm["status"]["observedGeneration"] == dm["metadata"]["generation"]
    return dm if ok and dm["status"].get("activeVersion") == version else None


def test_dashboard_labels_stable_service_and_address_follow_promotion(
        control_plane, namespace, api, operator_process, predictors):
    image = "mirror.example.com/arbiter/arbiter-runtime:9.9.9"  # the Helm value runtime.image, as the chart sets it
    operator_process(namespaces=[namespace], env={"ARBITER_RUNTIME_IMAGE": image})
    body = example()
    v2 = copy.deepcopy(body["spec"]["versions"][0])
    v2["name"], v2["storageUri"] = "1.1.0", "s3://models/credit-limit/1.1.0"
    body["spec"]["versions"].append(v2)
    create_dm(api, namespace, body)
    dm = eventually(lambda: _ready_at(api, namespace, "1.0.0"), 90, "Ready on 1.0.0")

    isvc = get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace, "credit-limit--1-0-0")
    assert isvc["metadata"]["labels"]["opendatahub.io/dashboard"] == "true"
    assert isvc["metadata"]["annotations"]["security.opendatahub.io/enable-auth"] == "true"
    runtime = get(api, "serving.kserve.io/v1alpha1", "servingruntimes", namespace, "credit-limit-runtime")
    assert runtime["metadata"]["labels"]["opendatahub.io/dashboard"] == "true"
    route = get(api, "route.openshift.io/v1", "routes", namespace, DM)
    assert route["spec"]["tls"]["termination"] == "reencrypt" and route["spec"]["port"] == {"targetPort": "https"}

    svc = client.CoreV1Api(api).read_namespaced_service(DM, namespace)
    assert svc.spec.selector == {"arbiter.dev/decision-model": DM, "arbiter.dev/version": "1.0.0",
                                 "arbiter.dev/component": "predictor"}
    assert [(p.port, p.target_port) for p in svc.spec.ports] == [(80, 8080)]
    assert svc.metadata.owner_references[0].uid == dm["metadata"]["uid"]
    assert dm["status"]["address"] == {"url": f"http://{DM}.{namespace}.svc.cluster.local"}
    # The predictor pods' labels match the selector (what KServe copies onto the pods).
    assert svc.spec.selector.items() <= isvc["spec"]["predictor"]["labels"].items()
    versions = {v["name"]: v for v in dm["status"]["versions"]}
    assert versions["1.0.0"]["runtimeImage"] == isvc["spec"]["predictor"]["model"]["image"] == image
    assert runtime["spec"]["containers"][0]["image"] == image

    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM,
        {"spec": {"promote": {"version": "1.1.0", "rollbackWindowSeconds": 0}}})
    eventually(lambda: _ready_at(api, namespace, "1.1.0"), 120, "Ready on 1.1.0")
    svc = eventually(lambda: (lambda s: s if s.spec.selector["arbiter.dev/version"] == "1.1.0" else None)(
        client.CoreV1Api(api).read_namespaced_service(DM, namespace)), 30, "the Service on 1.1.0")
    assert svc.metadata.labels["arbiter.dev/version"] == "1.1.0"
