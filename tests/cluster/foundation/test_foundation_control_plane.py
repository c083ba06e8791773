"""The local control plane is a real Kubernetes API: version, CRDs with their upstream schemas, admission, auth."""

from __future__ import annotations

import json
import uuid

import pytest
from arbiter_devenv.controlplane import ControlPlane
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.cluster


@pytest.fixture
def api(control_plane):
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


def test_version_is_the_pinned_kubernetes_release(control_plane, api):
    info = client.VersionApi(api).get_code()
    if isinstance(control_plane, ControlPlane):
        assert info.git_version == "v1.34.4"
        assert (info.major, info.minor) == ("1", "34")
    else:  # somebody else's cluster (ARBITER_TEST_KUBECONFIG, --kind): any Kubernetes 1.x
        assert info.major == "1"


def test_upstream_and_arbiter_crds_are_established(api):
    ext = client.ApiextensionsV1Api(api)
    found = json.loads(ext.list_custom_resource_definition(_preload_content=False).data)
    established = {
        crd["metadata"]["name"]
        for crd in found["items"]
        if any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    }
    assert {
        "inferenceservices.serving.kserve.io",
        "servingruntimes.serving.kserve.io",
        "routes.route.openshift.io",
        "modelregistries.modelregistry.opendatahub.io",
        "decisionmodels.arbiter.dev",
    } <= established


def _isvc(name: str, **predictor_extra: object) -> dict:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "vLLM"},
                    "runtime": "arbiter-vllm",
                    "storageUri": "s3://models/credit-risk/v3",
                },
                **predictor_extra,
            }
        },
    }


def test_inference_service_round_trips_through_the_kubernetes_client(api, namespace):
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", namespace, "inferenceservices", _isvc("credit-risk", minReplicas=1)
    )
    got = custom.get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", namespace, "inferenceservices", "credit-risk"
    )
    assert got["spec"]["predictor"]["model"]["storageUri"] == "s3://models/credit-risk/v3"
    assert got["spec"]["predictor"]["minReplicas"] == 1
    # KServe's defaulting webhook ran: 0.17 stores the legacy "RawDeployment" under its new name.
    assert got["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"


def test_inference_service_schema_is_enforced(api, namespace):
    # Only the full upstream schema knows minReplicas is an integer: a stub CRD would accept this.
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", namespace, "inferenceservices", _isvc("bad", minReplicas="two")
        )
    # 422 from the schema, or 400 from KServe's defaulting webhook, which decodes the object before the schema runs.
    assert err.value.status in (400, 422)
    assert "minReplicas" in err.value.body


def test_serving_runtime_round_trips(api, namespace):
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": "arbiter-vllm"},
        "spec": {
            "supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
            "containers": [{"name": "kserve-container", "image": "quay.io/arbiter/runtime:0.1.0"}],
        },
    }
    custom.create_namespaced_custom_object("serving.kserve.io", "v1alpha1", namespace, "servingruntimes", body)
    got = custom.get_namespaced_custom_object(
        "serving.kserve.io", "v1alpha1", namespace, "servingruntimes", "arbiter-vllm"
    )
    assert got["spec"]["containers"][0]["image"] == "quay.io/arbiter/runtime:0.1.0"


def test_route_round_trips_with_weighted_backends(api, namespace):
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": "credit-risk"},
        "spec": {
            "to": {"kind": "Service", "name": "credit-risk-v3-predictor", "weight": 90},
            "alternateBackends": [{"kind": "Service", "name": "credit-risk-v4-predictor", "weight": 10}],
            "port": {"targetPort": "http"},
            "tls": {"termination": "edge"},
        },
    }
    custom.create_namespaced_custom_object("route.openshift.io", "v1", namespace, "routes", body)
    got = custom.get_namespaced_custom_object("route.openshift.io", "v1", namespace, "routes", "credit-risk")
    assert got["spec"]["to"]["weight"] == 90
    assert got["spec"]["alternateBackends"] == [{"kind": "Service", "name": "credit-risk-v4-predictor", "weight": 10}]


def test_route_schema_rejects_an_out_of_range_weight(api, namespace):
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": "bad"},
        "spec": {"to": {"kind": "Service", "name": "svc", "weight": 300}},
    }
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("route.openshift.io", "v1", namespace, "routes", body)
    assert err.value.status == 422


def test_model_registry_status_hosts_are_kept(api, namespace):
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "modelregistry.opendatahub.io/v1beta1",
        "kind": "ModelRegistry",
        "metadata": {"name": "registry"},
        "spec": {"rest": {}, "grpc": {}},
    }
    where = ("modelregistry.opendatahub.io", "v1beta1", namespace, "modelregistries")
    custom.create_namespaced_custom_object(*where, body)
    custom.patch_namespaced_custom_object_status(
        *where, "registry", {"status": {"hosts": ["registry-rest.apps.example.com", "registry.ns.svc.cluster.local"]}}
    )
    got = custom.get_namespaced_custom_object(*where, "registry")
    assert got["status"]["hosts"][0] == "registry-rest.apps.example.com"
    assert got["spec"]["rest"]["port"] == 8080  # upstream default, applied by the schema


def _pod(name: str, *, privileged: bool) -> client.V1Pod:
    if privileged:
        security = client.V1SecurityContext(privileged=True)
        pod_security = None
    else:
        security = client.V1SecurityContext(
            allow_privilege_escalation=False,
            run_as_non_root=True,
            capabilities=client.V1Capabilities(drop=["ALL"]),
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        )
        pod_security = client.V1PodSecurityContext(run_as_non_root=True, run_as_user=1000)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="main", image="registry.example.com/app:1", security_context=security)],
            security_context=pod_security,
        ),
    )


def test_pod_security_restricted_namespace_rejects_a_privileged_pod(api, namespace):
    core = client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, _pod("privileged", privileged=True))
    assert err.value.status == 403
    assert "violates PodSecurity" in err.value.body and "restricted" in err.value.body
    # The same namespace admits a pod that meets the restricted profile: the rejection above is Pod Security's.
    created = core.create_namespaced_pod(namespace, _pod("compliant", privileged=False))
    assert created.metadata.name == "compliant"


def test_service_account_token_authenticates_and_rbac_limits_it(control_plane, api, namespace, tmp_path):
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="operator"))
    )
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="configmap-reader"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])],
    ))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="operator-reads-configmaps"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="operator", namespace=namespace)],
    ))
    token = core.create_namespaced_service_account_token(
        "operator", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token, namespace=namespace)

    from kubernetes import config

    sa_api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        review = client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview(metadata=client.V1ObjectMeta())
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:operator"
        sa_core = client.CoreV1Api(sa_api)
        assert sa_core.list_namespaced_config_map(namespace).items is not None
        with pytest.raises(ApiException) as err:
            sa_core.list_namespaced_secret(namespace)
        assert err.value.status == 403
        with pytest.raises(ApiException) as err:
            sa_core.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
            )
        assert err.value.status == 403
    finally:
        sa_api.close()


def test_a_forged_token_is_rejected(control_plane, tmp_path):
    from kubernetes import config

    forged_token = "eyJhbGciOiJFUzI1NiJ9.e30." + uuid.uuid4().hex  # well-formed JWT shape, no valid signature
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "forged", token=forged_token)
    forged = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(forged).list_namespace()
        assert err.value.status == 401
    finally:
        forged.close()


def test_installing_crds_again_replaces_them_in_place(api):
    from arbiter_devenv import crds

    # Arbiter's own CRD: replacing it is safe on any cluster (the fixture already did it once).
    names = crds.install_crds(api, crds.arbiter_crd_paths())
    assert "decisionmodels.arbiter.dev" in names
    # Still served after the replace: a list answers.
    client.CustomObjectsApi(api).list_cluster_custom_object("arbiter.dev", "v1alpha1", "decisionmodels")
