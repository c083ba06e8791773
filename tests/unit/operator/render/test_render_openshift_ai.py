"""What the controllers beside Arbiter on OpenShift AI read of its children: the deployment mode each KServe line
accepts (learnt from what KServe's webhook kept), the ServingRuntime's dashboard annotations and no second scrape
path, and the registry labels that send odh-model-controller's records to the registry Arbiter wrote."""

from __future__ import annotations

import pytest
from arbiter_operator.observe.kserve import DeploymentModes, kept_mode
from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice, render_servingruntime
from hypothesis import given
from hypothesis import strategies as st
from support.examples import example
from support.factory import make_dm

MODE = "serving.kserve.io/deploymentMode"
IDS = {"registeredModelId": "7", "modelVersionId": "12"}


def _isvc(raw=None, **kw):
    dm = make_dm(raw)
    v = dm.spec.versions[0]
    return render_inferenceservice(PredictorInputs(dm, v, render_configmap(dm, v), {}, **kw))


def _live(mode: str | None) -> dict:
    return {"metadata": {"annotations": {MODE: mode} if mode is not None else {}}}


@pytest.mark.parametrize("mode", ["RawDeployment", "Standard"])
def test_the_inferenceservice_names_the_mode_this_kserve_accepts(mode):
    assert _isvc(deployment_mode=mode)["metadata"]["annotations"][MODE] == mode


def test_a_first_inferenceservice_says_rawdeployment_which_every_kserve_line_deploys_as_a_plain_deployment():
    # KServe 0.15 (OpenShift AI 2.x, Open Data Hub <= 3.3) knows only RawDeployment; 0.16+ rewrites it to Standard.
    assert DeploymentModes().mode_for([]) == "RawDeployment"


def test_the_name_kserve_kept_is_rendered_from_then_on_for_this_and_every_later_model():
    modes = DeploymentModes()
    # KServe 0.16+ rewrote the first write: this model, and a model with no InferenceService yet, follow it.
    assert modes.mode_for([_live("Standard")]) == "Standard"
    assert modes.mode_for([]) == "Standard"
    # A model whose InferenceServices KServe 0.15 kept as RawDeployment keeps it (no write, no refusal by
    # KServe's validator, which forbids changing the mode of a deployed InferenceService).
    assert modes.mode_for([_live("RawDeployment")]) == "RawDeployment"


@given(st.lists(st.one_of(st.none(), st.sampled_from(["Standard", "RawDeployment", "Serverless", "Knative",
                                                         "ModelMesh", ""]), st.text(max_size=12)), max_size=5))
def test_someone_elses_mode_value_is_no_evidence(values):
    kept = kept_mode([_live(v) for v in values])
    if "Standard" in values:
        assert kept == "Standard"
    elif "RawDeployment" in values:
        assert kept == "RawDeployment"
    else:
        assert kept is None and DeploymentModes().mode_for([_live(v) for v in values]) == "RawDeployment"


def test_the_servingruntime_names_itself_to_the_dashboard_and_offers_vllm_metrics():
    sr = render_servingruntime(make_dm())
    ann = sr["metadata"]["annotations"]
    assert ann["opendatahub.io/template-display-name"] and ann["opendatahub.io/template-name"] == "arbiter-runtime"
    assert ann["opendatahub.io/apiProtocol"] == "REST"
    assert sr["metadata"]["labels"]["opendatahub.io/dashboard"] == "true"
    # odh-model-controller reads spec.annotations for its metrics page...
    assert sr["spec"]["annotations"] == {"opendatahub.io/kserve-runtime": "vllm"}


def test_no_prometheus_annotation_invites_a_second_scrape():
    # ...and would make a metrics Service + ServiceMonitor from prometheus.io/port: the PodMonitor is the one path.
    sr = render_servingruntime(make_dm())
    assert not [k for k in sr["spec"].get("annotations", {}) if k.startswith("prometheus.io/")]


def _with_registry(**registry):
    raw = example()
    raw["spec"]["registry"] = registry
    return raw


def test_a_registry_in_another_namespace_is_named_with_its_namespace():
    labels = _isvc(_with_registry(modelRegistryRef={"name": "public", "namespace": "rhoai-model-registries"}),
                   registry_ids=IDS)["metadata"]["labels"]
    assert labels["modelregistry.opendatahub.io/name"] == "public"
    assert labels["modelregistry.opendatahub.io/namespace"] == "rhoai-model-registries"
    same_ns = _isvc(_with_registry(modelRegistryRef={"name": "public"}), registry_ids=IDS)["metadata"]["labels"]
    assert same_ns["modelregistry.opendatahub.io/namespace"] == "team-a"


def test_a_registry_given_by_url_is_named_by_url_for_odh_model_controller():
    isvc = _isvc(_with_registry(url="https://registry.example.com"), registry_ids=IDS)
    assert isvc["metadata"]["annotations"]["modelregistry.opendatahub.io/url"] == "https://registry.example.com"
    assert "modelregistry.opendatahub.io/name" not in isvc["metadata"]["labels"]


def test_no_registry_label_before_the_ids_are_known():
    isvc = _isvc(_with_registry(url="https://registry.example.com"))
    assert not [k for k in {**isvc["metadata"]["labels"], **isvc["metadata"]["annotations"]}
                if k.startswith("modelregistry.opendatahub.io/")]


def test_the_dashboard_tells_callers_the_stable_address_beside_kserves_per_version_endpoints():
    # OpenShift AI's dashboard lists an InferenceService's own (internal -predictor) address as its endpoint and
    # shows its openshift.io/description in the deployment's details: that is where the stable address is named.
    description = _isvc()["metadata"]["annotations"]["openshift.io/description"]
    assert "Route credit-limit" in description
    assert "http://credit-limit.team-a.svc.cluster.local" in description and "1.0.0" in description
