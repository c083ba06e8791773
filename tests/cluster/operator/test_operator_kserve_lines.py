"""The KServe of OpenShift AI 2.x: a cluster of its own running KServe v0.15.2's controller and webhooks (the
release OpenShift AI 2.x's fork is cut from, which knows the plain-Deployment mode only as `RawDeployment`), with the
default mode OpenShift AI 2.x's settings give it, `Serverless`.

- The operator's DecisionModel turns Ready=True on a plain predictor Deployment: the InferenceService says
  `RawDeployment`, KServe kept it and recorded that mode, and the converged model costs no write.
- What an operator that always wrote `Standard` met on this line: KServe resolves it to its default, `Serverless`
  (a Knative service; with Knative absent, as here, it refuses the InferenceService with a Warning Event), and no
  predictor Deployment is made.

The KServe 0.17 line (where `RawDeployment` becomes `Standard`) is the session cluster's:
tests/cluster/operator/test_operator_openshift_ai.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv import crds
from arbiter_devenv.cluster import LocalCluster, wait_default_service_account
from arbiter_devenv.kserve import CONFIGMAP, KSERVE_0_15, NAMESPACE
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.operator_kit import condition, create_dm, eventually, example, get, seed_model_storage

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DM, ISVC = "credit-limit", "credit-limit--1-0-0"
MODE = "serving.kserve.io/deploymentMode"


@pytest.fixture(scope="module")
def kserve_015(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(kserve_line=KSERVE_0_15, workdir=tmp_path_factory.mktemp("kserve-0.15")).start()
    try:
        api = cluster.api_client()
        try:
            crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths())  # KServe's own are kept
            crds.install_crds(api, crds.arbiter_crd_paths())
            # OpenShift AI 2.x's default mode (its DataScienceCluster's default): what a name KServe does not know
            # falls back to.
            core = client.CoreV1Api(api)
            cm = core.read_namespaced_config_map(CONFIGMAP, NAMESPACE)
            cm.data["deploy"] = json.dumps({"defaultDeploymentMode": "Serverless"})
            core.replace_namespaced_config_map(CONFIGMAP, NAMESPACE, cm)
        finally:
            api.close()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ns_015(kserve_015: LocalCluster, s3_server: Any) -> Iterator[tuple[client.ApiClient, str]]:
    api = kserve_015.api_client()
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_default_service_account(api, name)
    seed_model_storage(s3_server, api, name)
    try:
        yield api, name
    finally:
        client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")
        api.close()


def _isvc(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    return get(api, "serving.kserve.io/v1beta1", "inferenceservices", ns, name)


def _deployment(api: client.ApiClient, ns: str, name: str) -> Any:
    try:
        return client.AppsV1Api(api).read_namespaced_deployment(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_on_the_015_line_the_operator_writes_rawdeployment_and_serves(kserve_015, ns_015, tmp_path):
    api, ns = ns_015
    with OperatorProcess(kserve_015.kubeconfig, [ns], log_dir=tmp_path / "operator") as op:
        create_dm(api, ns, example())

        def ready():
            dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, DM) or {}
            c = condition(dm, "Ready") or {}
            return dm if c.get("status") == "True" else None

        eventually(ready, 120, "Ready=True on KServe 0.15")
        isvc = _isvc(api, ns, ISVC)
        assert isvc is not None
        assert isvc["metadata"]["annotations"][MODE] == "RawDeployment"
        assert isvc["status"]["deploymentMode"] == "RawDeployment"  # what KServe deployed it as
        assert _deployment(api, ns, f"{ISVC}-predictor") is not None
        # Converged on this line too: a pass (queued by an annotation on the DecisionModel) writes nothing.
        writes = len(op.writes())
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "arbiter.dev", "v1alpha1", ns, "decisionmodels", DM, {"metadata": {"annotations": {"example.com/n": "1"}}})
        time.sleep(3)
        assert len(op.writes()) == writes, op.writes()[writes:]


def test_standard_is_a_name_the_015_line_does_not_know(kserve_015, ns_015):
    """Why the mode is learnt: `Standard`, KServe 0.16+'s name, gets this KServe's default mode instead."""
    api, ns = ns_015
    raw = example()
    raw["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), generation=1)
    dm = DecisionModel.model_validate(raw)
    version = dm.spec.versions[0]
    isvc = render_inferenceservice(PredictorInputs(dm, version, render_configmap(dm, version), {},
                                                   deployment_mode="Standard"))
    isvc["metadata"].pop("ownerReferences")
    isvc["metadata"]["name"] = "standard-1"
    objs = client.CustomObjectsApi(api)
    objs.create_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices", isvc)

    def rejected():
        events = client.CoreV1Api(api).list_namespaced_event(
            ns, field_selector="involvedObject.name=standard-1,reason=ServerlessModeRejected").items
        return events[0] if events else None

    event = eventually(rejected, 60, "KServe resolving Standard to Serverless")
    assert event.type == "Warning" and "Serverless" in event.message
    assert _deployment(api, ns, "standard-1-predictor") is None  # no plain Deployment
    assert not ((_isvc(api, ns, "standard-1") or {}).get("status") or {}).get("deploymentMode")
