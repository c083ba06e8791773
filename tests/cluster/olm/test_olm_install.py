"""OLM itself installs the bundle on the local control plane: its olm-operator and catalog-operator (built from
OLM's Go module) resolve a Subscription against the file-based catalog served by `opm serve`, run the InstallPlan,
and install the CSV; then the Deployment OLM made is started as its pod would be (its command, args, environment,
volumes and ServiceAccount: tests/support/podrun.py), with only the RBAC OLM created from the CSV, and serves the
OperatorGroup's namespaces and no other. No containers: see arbiter_devenv.olm for how the processes are wired.

Three install modes run (about 20 s each once OLM's binaries are built): MultiNamespace, OwnNamespace and
AllNamespaces; SingleNamespace is MultiNamespace with one target (the same olm.targetNamespaces list, Roles in it, the
Lease in the operator's own namespace)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import tempfile
import uuid
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from arbiter_devenv import crds, olmbundle
from arbiter_devenv.cluster import wait_default_service_account
from arbiter_devenv.olm import CATALOG_PORT, LocalOLM
from arbiter_devenv.tools import ensure_tool, tools_dir
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.examples import example
from support.operator_kit import seed_model_storage
from support.paths import REPO
from support.podrun import DeploymentPod
from support.polling import eventually

ROOT = REPO
OLM_GROUP = "operators.coreos.com"
# OLM's operators and opm are built from their Go modules (hack/tools/olm, olm-catalog, opm: "optional", so the
# local run's hack/setup.sh skips them; hack/test.sh builds them, about ten minutes cold on two cores).
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def olm_crd_paths() -> list[pathlib.Path]:
    module = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}",
                             "github.com/operator-framework/operator-lifecycle-manager"],
                            cwd=tools_dir() / "olm", capture_output=True, text=True, timeout=300, check=True)
    return sorted(pathlib.Path(module.stdout.strip(), "deploy", "chart", "crds").glob("*.yaml"))


def local_catalog(tmp: pathlib.Path) -> pathlib.Path:
    """The committed catalog with the bundle image left out: the bundle's objects are in the catalog
    (olm.bundle.object), so OLM takes them from there instead of running the bundle image in an unpack Job."""
    out = tmp / "catalog" / olmbundle.PACKAGE
    out.mkdir(parents=True)
    docs = [d for d in yaml.safe_load_all((ROOT / "catalog" / olmbundle.PACKAGE / "catalog.yaml").read_text()) if d]
    for d in docs:
        if d["schema"] == "olm.bundle":
            d["image"] = ""
            d.pop("relatedImages", None)
    (out / "catalog.yaml").write_text("".join("---\n" + yaml.safe_dump(d) for d in docs))
    return tmp / "catalog"


def wait_for(what: str, fn, timeout: float, olm: LocalOLM, interval: float = 2.0):
    """fn() -> (reached, what was seen): what was seen once reached; fails at once when an OLM process died."""
    seen: list[Any] = [None]

    def reached() -> tuple[Any] | None:
        ok, seen[0] = fn()
        return (seen[0],) if ok else None

    (value,) = eventually(reached, timeout, what, interval=interval, check=olm.check,
                          context=lambda: f"last seen: {seen[0]}; logs in {olm.workdir}")
    return value


def _namespace(core: client.CoreV1Api, api: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name,
                                                                          labels={"arbiter.dev/test": "true"})))
    wait_default_service_account(api, name)
    return name


def _openshift_service_ca(api: client.ApiClient, control_plane: Any, namespace: str, tmp: pathlib.Path) -> None:
    """What OpenShift's service CA does for the bundle's objects, which no plain apiserver does: the serving
    certificate the metrics Service's annotation asks for, and the CA bundle ConfigMap every namespace holds."""
    core = client.CoreV1Api(api)
    service = yaml.safe_load((ROOT / "bundle" / "manifests" / "arbiter-metrics_v1_service.yaml").read_text())
    secret = service["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"]
    crt, key = control_plane.issue_serving_certificate(tmp / "service-ca", "tls")
    core.create_namespaced_secret(namespace, {"metadata": {"name": secret}, "type": "kubernetes.io/tls",
                                              "stringData": {"tls.crt": crt.read_text(), "tls.key": key.read_text()}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "openshift-service-ca.crt"},
                                                  "data": {"service-ca.crt": pathlib.Path(control_plane.ca_file)
                                                           .read_text()}})


@pytest.mark.parametrize("mode", ["MultiNamespace", "OwnNamespace", "AllNamespaces"])
def test_olm_installs_the_bundle_and_its_deployment_serves_the_target_namespaces_only(
        control_plane, s3_server, tmp_path, mode):
    """Each install mode the CSV supports but SingleNamespace (MultiNamespace with one target: the same path):
    MultiNamespace, the operator in a namespace of its own, two targets and one namespace outside the OperatorGroup;
    OwnNamespace, the operator's own namespace its one target, one outside; AllNamespaces, every namespace (two
    fresh ones are checked). The operator runs exactly as the Deployment OLM made says (tests/support/podrun.py):
    command, args, environment (OLM's olm.targetNamespaces -> ARBITER_NAMESPACES), volumes (OLM's webhook
    certificate, the projected ServiceAccount token for Prometheus) and ServiceAccount (the RBAC OLM made of the
    CSV)."""
    binaries = {name: ensure_tool(name) for name in ("olm", "olm-catalog", "opm")}
    api = control_plane.api_client()
    core, objs = client.CoreV1Api(api), client.CustomObjectsApi(api)
    crds.install_crds(api, olm_crd_paths())
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="olm")))
    except ApiException as exc:
        assert exc.status == 409
    operator_ns = _namespace(core, api, "arbiter-op")
    if mode == "OwnNamespace":
        targets, served, outsider = [operator_ns], [operator_ns], _namespace(core, api, "team-c")
    elif mode == "MultiNamespace":
        targets = served = [_namespace(core, api, "team-a"), _namespace(core, api, "team-b")]
        outsider = _namespace(core, api, "team-c")
    else:
        targets, served, outsider = [], [_namespace(core, api, "team-a"), _namespace(core, api, "team-b")], None
    created = sorted({operator_ns, *served, *([outsider] if outsider else [])})
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    olm = LocalOLM(kubeconfig, control_plane.server, tmp_path, local_catalog(tmp_path), binaries).start()
    pod: DeploymentPod | None = None
    try:
        objs.create_namespaced_custom_object(OLM_GROUP, "v1alpha1", "olm", "catalogsources", {
            "apiVersion": f"{OLM_GROUP}/v1alpha1", "kind": "CatalogSource", "metadata": {"name": "arbiter-local"},
            "spec": {"sourceType": "grpc", "address": f"127.0.0.1:{CATALOG_PORT}", "displayName": "Arbiter"}})
        objs.create_namespaced_custom_object(OLM_GROUP, "v1", operator_ns, "operatorgroups", {
            "apiVersion": f"{OLM_GROUP}/v1", "kind": "OperatorGroup", "metadata": {"name": "arbiter"},
            "spec": {"targetNamespaces": targets} if targets else {}})
        objs.create_namespaced_custom_object(OLM_GROUP, "v1alpha1", operator_ns, "subscriptions", {
            "apiVersion": f"{OLM_GROUP}/v1alpha1", "kind": "Subscription", "metadata": {"name": olmbundle.PACKAGE},
            "spec": {"channel": olmbundle.CHANNEL, "name": olmbundle.PACKAGE, "source": "arbiter-local",
                     "sourceNamespace": "olm", "installPlanApproval": "Automatic"}})
        csv_name = yaml.safe_load((ROOT / "bundle" / "manifests" /
                                   f"{olmbundle.PACKAGE}.clusterserviceversion.yaml").read_text())["metadata"]["name"]

        def csv_phase():
            try:
                csv = objs.get_namespaced_custom_object(OLM_GROUP, "v1alpha1", operator_ns,
                                                        "clusterserviceversions", csv_name)
            except ApiException as exc:
                sub = objs.get_namespaced_custom_object(OLM_GROUP, "v1alpha1", operator_ns, "subscriptions",
                                                        olmbundle.PACKAGE)
                return False, f"no CSV yet ({exc.status}); subscription: {(sub.get('status') or {}).get('conditions')}"
            status = csv.get("status") or {}
            return status.get("phase") == "Succeeded", f"{status.get('phase')}: {status.get('message')}"

        wait_for("CSV Succeeded", csv_phase, 420, olm)

        # What OLM made of the CSV: the Deployment with the OperatorGroup's namespaces in the pod annotation the
        # operator reads, and the admission webhook with a certificate OLM issued, mounted where the operator's flag
        # points, its configuration scoped to the OperatorGroup's namespaces.
        dep = client.AppsV1Api(api).read_namespaced_deployment("arbiter", operator_ns)
        target_annotation = dep.spec.template.metadata.annotations["olm.targetNamespaces"]
        assert sorted(filter(None, target_annotation.split(","))) == sorted(targets)  # "" for AllNamespaces
        mounts = {m.mount_path for m in dep.spec.template.spec.containers[0].volume_mounts or []}
        assert "/tmp/k8s-webhook-server/serving-certs" in mounts, mounts
        hooks = [w for c in client.AdmissionregistrationV1Api(api).list_validating_webhook_configuration().items
                 for w in c.webhooks or [] if w.name.startswith("decisionmodels.arbiter.dev")
                 and w.client_config.service and w.client_config.service.namespace == operator_ns]
        assert len(hooks) == 1 and hooks[0].client_config.service.path == "/decisionmodels", hooks
        assert hooks[0].failure_policy == "Ignore" and hooks[0].client_config.ca_bundle

        for ns in (*served, *([outsider] if outsider else [])):
            seed_model_storage(s3_server, api, ns)
        _openshift_service_ca(api, control_plane, operator_ns, tmp_path)
        pod = DeploymentPod(api, control_plane, operator_ns, "arbiter", tmp_path / "pod", ROOT / "Dockerfile.operator",
                            "/opt/arbiter/bin", forward_ports=(urlparse(s3_server.endpoint_url).port or 80,)).start()
        argv, env, _ = pod.argv_env()
        assert argv[0].endswith("/arbiter-operator") and "--leader-elect" in argv  # the image's entry point, OLM's args
        assert sorted(filter(None, env["ARBITER_NAMESPACES"].split(","))) == sorted(targets)
        assert env["ARBITER_OPERATOR_NAMESPACE"] == operator_ns

        body = example()
        for ns in (*served, *([outsider] if outsider else [])):
            objs.create_namespaced_custom_object("arbiter.dev", "v1alpha1", ns, "decisionmodels", body)
        name = body["metadata"]["name"]

        def ready(ns: str):
            def check():
                dm = objs.get_namespaced_custom_object("arbiter.dev", "v1alpha1", ns, "decisionmodels", name)
                status = dm.get("status") or {}
                c = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), None)
                return (c is not None and c["status"] == "True"
                        and c.get("observedGeneration") == dm["metadata"]["generation"]), status
            return check

        for ns in served:
            wait_for(f"{ns}/{name} Ready=True", ready(ns), 180, olm)
        if outsider:
            # Outside the OperatorGroup the operator neither watches nor may write: the DecisionModel there was
            # created with the others and is untouched after the targets turned Ready (no status, no
            # InferenceService).
            dm = objs.get_namespaced_custom_object("arbiter.dev", "v1alpha1", outsider, "decisionmodels", name)
            assert not dm.get("status"), dm.get("status")
            assert not objs.list_namespaced_custom_object("serving.kserve.io", "v1beta1", outsider,
                                                          "inferenceservices")["items"]
        # The leader's Lease is in the operator's namespace, granted by the CSV's permissions there.
        lease = client.CoordinationV1Api(api).read_namespaced_lease("arbiter-operator-leader", operator_ns)
        assert lease.spec.holder_identity.startswith(pod.pod_name)
        # A refused request logs as "403 Forbidden: ..." (the operator's KubeError) or kopf's APIForbiddenError;
        # a bare "403" would also match random namespace names and timestamps.
        # (Across all namespaces, only this test's: the shared cluster may hold other tests' namespaces being
        # deleted, where the apiserver forbids any new object.)
        forbidden = [line for line in pod.log().splitlines() if "forbidden" in line.lower()
                     and (targets or any(ns in line for ns in created))]
        assert not forbidden, forbidden[:5]
    finally:
        if pod is not None:
            pod.stop()
        olm.stop()
        # OLM is gone before its CSV: remove the webhook configuration it made (it names the operator's Service).
        admission = client.AdmissionregistrationV1Api(api)
        for conf in admission.list_validating_webhook_configuration().items:
            if any(w.client_config.service and w.client_config.service.namespace == operator_ns
                   for w in conf.webhooks or []):
                admission.delete_validating_webhook_configuration(conf.metadata.name)
        for plural, ns in (("subscriptions", operator_ns), ("clusterserviceversions", operator_ns),
                           ("catalogsources", "olm")):
            for item in objs.list_namespaced_custom_object(OLM_GROUP, "v1alpha1", ns, plural)["items"]:
                objs.delete_namespaced_custom_object(OLM_GROUP, "v1alpha1", ns, plural, item["metadata"]["name"])
        for ns in created:
            core.delete_namespace(ns, propagation_policy="Background")
        api.close()
        shutil.rmtree(tmp_path / "opm-cache", ignore_errors=True)


def test_opm_validates_the_file_based_catalog():
    proc = subprocess.run([str(ensure_tool("opm")), "validate", str(ROOT / "catalog")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # ... and refuses a channel that names a bundle the catalog lacks (the check has teeth).
    docs = [d for d in yaml.safe_load_all((ROOT / "catalog" / olmbundle.PACKAGE / "catalog.yaml").read_text()) if d]
    for d in docs:
        if d["schema"] == "olm.channel":
            d["entries"].append({"name": f"{olmbundle.PACKAGE}.v9.9.9", "replaces": d["entries"][0]["name"]})
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "c").mkdir()
        (pathlib.Path(tmp) / "c" / "catalog.yaml").write_text("".join("---\n" + yaml.safe_dump(d) for d in docs))
        bad = subprocess.run([str(ensure_tool("opm")), "validate", tmp], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "v9.9.9" in bad.stderr + bad.stdout
