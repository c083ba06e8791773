"""Builders, without a cluster: what each child manifest says for a given spec."""

from __future__ import annotations

import json

import pytest
from arbiter_operator.render import (
    PredictorInputs,
    render_configmap,
    render_inferenceservice,
    render_route,
    render_servingruntime,
)
from arbiter_operator.render.mesh import EXCLUDE_INBOUND, INJECT
from support.examples import example
from support.factory import make_dm


def _isvc(raw=None, ns_labels=None, **kw):
    dm = make_dm(raw)
    v = dm.spec.versions[0]
    cm = render_configmap(dm, v, diffusion=kw.get("diffusion", False))
    return render_inferenceservice(PredictorInputs(dm, v, cm, ns_labels or {}, **kw))


def _with(**serving):
    raw = example()
    raw["spec"]["serving"].update(serving)
    return raw


def test_inferenceservice_basics():
    isvc = _isvc()
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["metadata"]["name"] == "credit-limit--1-0-0"
    # The plain-Deployment mode under the name every KServe line accepts, until KServe answers with its own name.
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["metadata"]["labels"]["arbiter.dev/decision-model"] == "credit-limit"
    assert isvc["metadata"]["labels"]["arbiter.dev/version"] == "1.0.0"
    owner = isvc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("DecisionModel", "credit-limit",
                                                                                 "0000-uid", True)
    pred = isvc["spec"]["predictor"]
    model = pred["model"]
    assert model["modelFormat"] == {"name": "vLLM"}
    assert model["runtime"] == "credit-limit-runtime"
    # s3: KServe's storage-spec form, so its storage initializer gets the storage-config entry's credentials.
    assert "storageUri" not in model
    assert model["storage"] == {"key": "default", "path": "credit-limit/1.0.0",
                                "parameters": {"type": "s3", "bucket": "models"}}
    assert isvc["metadata"]["annotations"]["serving.kserve.io/storageSecretName"] == "storage-config"
    assert model["resources"]["requests"]["nvidia.com/gpu"] == "1" == model["resources"]["limits"]["nvidia.com/gpu"]
    assert "--tensor-parallel-size=1" in model["args"] and "--seed=42" in model["args"]
    assert "--max-model-len=4096" in model["args"] and "--max-num-seqs=32" in model["args"]
    assert "nodeSelector" not in pred  # no GPU product pinned unless spec.serving.gpuProduct names one
    assert pred["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert model["startupProbe"]["failureThreshold"] * model["startupProbe"]["periodSeconds"] >= 1200
    assert not any(v["name"] == "shm" for v in pred["volumes"])  # TP 1: no shared memory between ranks
    assert "workerSpec" not in pred
    assert model["securityContext"]["allowPrivilegeEscalation"] is False
    assert "runAsUser" not in json.dumps(isvc)  # restricted-v2 assigns the uid
    assert isvc["metadata"]["annotations"]["security.opendatahub.io/enable-auth"] == "true"


def test_tensor_parallel_gets_gpus_and_shared_memory():
    pred = _isvc(_with(gpus=4))["spec"]["predictor"]
    assert pred["model"]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "--tensor-parallel-size=4" in pred["model"]["args"]
    shm = next(v for v in pred["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in pred["model"]["volumeMounts"]


def test_multi_node_uses_worker_spec_and_pipeline_parallel():
    pred = _isvc(_with(gpus=2, nodes=2))["spec"]["predictor"]
    assert pred["workerSpec"]["pipelineParallelSize"] == 2
    assert pred["workerSpec"]["tensorParallelSize"] == 2
    assert pred["workerSpec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--pipeline-parallel-size=2" in pred["model"]["args"]
    runtime = render_servingruntime(make_dm(_with(gpus=2, nodes=2)))
    assert "workerSpec" in runtime["spec"]


def test_any_gpu_when_product_is_empty():
    assert "nodeSelector" not in _isvc(_with(gpuProduct=""))["spec"]["predictor"]
    assert _isvc(_with(gpuProduct="NVIDIA-H100-80GB-HBM3"))["spec"]["predictor"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_diffusion_models_get_no_seed_nor_structured_outputs():
    args = _isvc(diffusion=True)["spec"]["predictor"]["model"]["args"]
    assert not any(a.startswith(("--seed", "--structured-outputs-config")) for a in args)


def test_extra_args_follow_rendered_ones():
    raw = example()
    raw["spec"]["serving"]["vllm"]["extraArgs"] = ["--enable-prefix-caching"]
    args = _isvc(raw)["spec"]["predictor"]["model"]["args"]
    assert args[0] == "/mnt/models" and args[-1] == "--enable-prefix-caching"


def test_registry_ids_become_labels():
    labels = _isvc(registry_ids={"registeredModelId": "7", "modelVersionId": "12"})["metadata"]["labels"]
    assert labels["modelregistry.opendatahub.io/registered-model-id"] == "7"
    assert labels["modelregistry.opendatahub.io/model-version-id"] == "12"


@pytest.mark.parametrize(
    "mode, ns_labels, annotations, labels",
    [
        ("auto", {"istio-injection": "enabled"}, {EXCLUDE_INBOUND: "8080"}, {}),
        ("auto", {"istio.io/rev": "default"}, {EXCLUDE_INBOUND: "8080"}, {}),
        ("auto", {}, {}, {}),
        ("auto", {"istio-injection": "disabled", "istio.io/rev": "x"}, {}, {}),
        ("exclude-inbound", {}, {EXCLUDE_INBOUND: "8080"}, {}),
        ("disable", {}, {INJECT: "false"}, {INJECT: "false"}),
        ("none", {"istio-injection": "enabled"}, {}, {}),
    ],
)
def test_mesh_sidecar(mode, ns_labels, annotations, labels):
    raw = example()
    raw["spec"]["mesh"] = {"sidecar": mode}
    pred = _isvc(raw, ns_labels)["spec"]["predictor"]
    mesh_ann = {k: v for k, v in pred["annotations"].items() if "istio" in k}
    mesh_lab = {k: v for k, v in pred["labels"].items() if "istio" in k}
    assert (mesh_ann, mesh_lab) == (annotations, labels)


def test_changed_decision_settings_roll_the_pods():
    before = _isvc()["spec"]["predictor"]["annotations"]["arbiter.dev/decision-config-checksum"]
    raw = example()
    raw["spec"]["decision"]["confidenceThreshold"] = 0.9
    after = _isvc(raw)["spec"]["predictor"]["annotations"]["arbiter.dev/decision-config-checksum"]
    assert before != after
    assert before == _isvc()["spec"]["predictor"]["annotations"]["arbiter.dev/decision-config-checksum"]


def test_configmap_is_the_runtime_contract():
    from arbiter_runtime.config import parse_config

    dm = make_dm()
    cm = render_configmap(dm, dm.spec.versions[0])
    assert cm["metadata"]["name"] == "credit-limit--1-0-0-decision"
    cfg = json.loads(cm["data"]["decision.json"])
    assert set(cfg) >= {"model", "version", "labels", "reasoningCodes", "steps", "trajectoryMode",
                        "confidenceThreshold", "lowConfidencePolicy", "deadlineMs", "inputSchema", "outputSchema",
                        "fallbackRules", "sla"}
    assert cfg["sla"] == {"p95LatencyMs": 150}
    parsed = parse_config(cfg)  # the runtime accepts what the operator renders
    assert parsed.labels == ("approved", "rejected", "review")
    assert parsed.fallback_rules[0].name == "large-request-needs-review"


def test_version_override_wins():
    raw = example()
    raw["spec"]["versions"][0]["decision"] = {"confidenceThreshold": 0.95, "steps": 2}
    dm = make_dm(raw)
    cfg = json.loads(render_configmap(dm, dm.spec.versions[0])["data"]["decision.json"])
    assert (cfg["confidenceThreshold"], cfg["steps"], cfg["deadlineMs"]) == (0.95, 2, 800)


def test_route_weights_tls_and_timeout():
    dm = make_dm()
    route = render_route(dm, {"1.0.0": 90, "1.1.0": 10})
    assert route["metadata"]["name"] == "credit-limit"  # never an InferenceService's name
    assert route["spec"]["to"] == {"kind": "Service", "name": "credit-limit--1-0-0-predictor", "weight": 90}
    assert route["spec"]["alternateBackends"] == [
        {"kind": "Service", "name": "credit-limit--1-1-0-predictor", "weight": 10}
    ]
    # auth on (the default): re-encrypt to the platform's authenticating proxy port on every predictor Service
    assert route["spec"]["tls"] == {"termination": "reencrypt", "insecureEdgeTerminationPolicy": "Redirect"}
    assert route["spec"]["port"] == {"targetPort": "https"}
    assert route["metadata"]["annotations"]["haproxy.router.openshift.io/timeout"] == "30s"
    single = render_route(dm, {"1.0.0": 100})
    assert "alternateBackends" not in single["spec"] and single["spec"]["to"]["weight"] == 100
    assert render_route(dm, {}) is None

    raw = example()
    raw["spec"]["exposure"] = {"tls": "reencrypt", "host": "credit.apps.example.com"}
    route = render_route(make_dm(raw), {"1.0.0": 100})
    assert route["spec"]["tls"]["termination"] == "reencrypt"
    assert route["spec"]["host"] == "credit.apps.example.com"


def test_podmonitor_presents_the_operators_metrics_reader_secret_only_when_auth_is_on():
    from arbiter_operator.render import render_podmonitor

    raw = example()
    pm = render_podmonitor(make_dm(raw), "team-a-prometheus")
    assert {e["authorization"]["credentials"]["name"] for e in pm["spec"]["podMetricsEndpoints"]} == \
        {"team-a-prometheus"}
    assert all("bearerTokenFile" not in e and "bearerTokenSecret" not in e for e in pm["spec"]["podMetricsEndpoints"])
    raw["spec"]["exposure"]["auth"] = False
    pm = render_podmonitor(make_dm(raw), "team-a-prometheus")
    assert [set(e) for e in pm["spec"]["podMetricsEndpoints"]] == [{"port", "path", "scheme"},
                                                                  {"port", "path", "scheme", "relabelings"}]


def test_servingruntime_is_owned_and_uses_the_image():
    raw = _with(runtimeImage="registry.example.com/arbiter/runtime:1.2")
    sr = render_servingruntime(make_dm(raw))
    assert sr["metadata"]["name"] == "credit-limit-runtime"
    assert sr["metadata"]["ownerReferences"][0]["kind"] == "DecisionModel"
    assert sr["spec"]["supportedModelFormats"] == [{"name": "vLLM", "autoSelect": False}]
    assert sr["spec"]["containers"][0]["image"] == "registry.example.com/arbiter/runtime:1.2"


def test_podmonitor_scrapes_the_predictors_of_this_decision_model_by_version():
    from arbiter_operator.render import render_podmonitor

    dm = make_dm()
    pm = render_podmonitor(dm)
    assert (pm["apiVersion"], pm["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert pm["metadata"]["namespace"] == "team-a" and pm["metadata"]["name"] == "credit-limit"
    assert pm["metadata"]["ownerReferences"][0]["uid"] == "0000-uid"
    assert pm["spec"]["selector"] == {"matchLabels": {"arbiter.dev/decision-model": "credit-limit"}}
    # The analysis selects series by these target labels (arbiter_dev_decision_model, arbiter_dev_version).
    assert pm["spec"]["podTargetLabels"] == ["arbiter.dev/decision-model", "arbiter.dev/version"]
    # The decision server's port, by the name the ServingRuntime gives it; vLLM binds loopback and is not scraped.
    runtime_ports = render_servingruntime(dm)["spec"]["containers"][0]["ports"]
    # Auth on (the default): the runtime answers a scrape only with a token allowed `get /metrics`, presented from
    # the operator's metrics-reader Secret in the model's namespace.
    bearer = {"type": "Bearer", "credentials": {"name": "arbiter-metrics-reader", "key": "token"}}
    assert pm["spec"]["podMetricsEndpoints"] == [
        {"port": "http1", "path": "/metrics", "scheme": "http", "authorization": bearer},
        {"port": "http1", "path": "/metrics/vllm", "scheme": "http", "authorization": bearer,
         # one port, two endpoints: the second names itself, so each target's `up` is a series of its own
         "relabelings": [{"action": "replace", "targetLabel": "endpoint", "replacement": "vllm"}]}]
    assert {"containerPort": 8080, "name": "http1", "protocol": "TCP"} in runtime_ports
    # The predictor pods carry the selected and copied labels.
    pod_labels = _isvc()["spec"]["predictor"]["labels"]
    assert pod_labels["arbiter.dev/decision-model"] == "credit-limit" and pod_labels["arbiter.dev/version"] == "1.0.0"
