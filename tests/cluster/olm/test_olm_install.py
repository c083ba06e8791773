"""OLM itself installs the bundle on the local control plane: its olm-operator and catalog-operator (built from
OLM's Go module) resolve a Subscription against the file-based catalog served by `opm serve`, run the InstallPlan,
and install the CSV; then the Arbiter operator, running with only the RBAC OLM created from the CSV, reconciles a
DecisionModel. No containers: see arbiter_devenv.olm for how the processes are wired."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import tempfile
from typing import Any

import pytest
import yaml
from arbiter_devenv import crds, olmbundle
from arbiter_devenv.olm import CATALOG_PORT, LocalOLM
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_devenv.tools import ensure_tool, tools_dir
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.examples import example
from support.paths import REPO
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


def test_olm_installs_the_bundle_and_the_operator_works_with_the_csvs_rbac(control_plane, namespace, tmp_path):
    binaries = {name: ensure_tool(name) for name in ("olm", "olm-catalog", "opm")}
    api = control_plane.api_client()
    core, objs = client.CoreV1Api(api), client.CustomObjectsApi(api)
    crds.install_crds(api, olm_crd_paths())
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="olm")))
    except ApiException as exc:
        assert exc.status == 409
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    olm = LocalOLM(kubeconfig, control_plane.server, tmp_path, local_catalog(tmp_path), binaries).start()
    try:
        objs.create_namespaced_custom_object(OLM_GROUP, "v1alpha1", "olm", "catalogsources", {
            "apiVersion": f"{OLM_GROUP}/v1alpha1", "kind": "CatalogSource", "metadata": {"name": "arbiter-local"},
            "spec": {"sourceType": "grpc", "address": f"127.0.0.1:{CATALOG_PORT}", "displayName": "Arbiter"}})
        objs.create_namespaced_custom_object(OLM_GROUP, "v1", namespace, "operatorgroups", {
            "apiVersion": f"{OLM_GROUP}/v1", "kind": "OperatorGroup", "metadata": {"name": "arbiter"},
            "spec": {"targetNamespaces": [namespace]}})
        objs.create_namespaced_custom_object(OLM_GROUP, "v1alpha1", namespace, "subscriptions", {
            "apiVersion": f"{OLM_GROUP}/v1alpha1", "kind": "Subscription", "metadata": {"name": olmbundle.PACKAGE},
            "spec": {"channel": olmbundle.CHANNEL, "name": olmbundle.PACKAGE, "source": "arbiter-local",
                     "sourceNamespace": "olm", "installPlanApproval": "Automatic"}})
        csv_name = yaml.safe_load((ROOT / "bundle" / "manifests" /
                                   f"{olmbundle.PACKAGE}.clusterserviceversion.yaml").read_text())["metadata"]["name"]

        def csv_phase():
            try:
                csv = objs.get_namespaced_custom_object(OLM_GROUP, "v1alpha1", namespace,
                                                        "clusterserviceversions", csv_name)
            except ApiException as exc:
                sub = objs.get_namespaced_custom_object(OLM_GROUP, "v1alpha1", namespace, "subscriptions",
                                                        olmbundle.PACKAGE)
                return False, f"no CSV yet ({exc.status}); subscription: {(sub.get('status') or {}).get('conditions')}"
            status = csv.get("status") or {}
            return status.get("phase") == "Succeeded", f"{status.get('phase')}: {status.get('message')}"

        wait_for("CSV Succeeded", csv_phase, 420, olm)

        # What OLM made of the CSV: the operator's ServiceAccount, its Role in the target namespace, the Deployment
        # with the OperatorGroup's namespaces in the pod annotation the operator reads.
        dep = client.AppsV1Api(api).read_namespaced_deployment("arbiter", namespace)
        assert dep.spec.template.metadata.annotations["olm.targetNamespaces"] == namespace
        # The admission webhook: OLM issued its certificate, mounted it where the operator's flag points, and made the
        # configuration for the operator's Service, scoped to the OperatorGroup's namespaces.
        mounts = {m.mount_path for m in dep.spec.template.spec.containers[0].volume_mounts or []}
        assert "/tmp/k8s-webhook-server/serving-certs" in mounts, mounts
        hooks = [w for c in client.AdmissionregistrationV1Api(api).list_validating_webhook_configuration().items
                 for w in c.webhooks or [] if w.name.startswith("decisionmodels.arbiter.dev")
                 and w.client_config.service and w.client_config.service.namespace == namespace]
        assert len(hooks) == 1 and hooks[0].client_config.service.path == "/decisionmodels", hooks
        assert hooks[0].failure_policy == "Ignore" and hooks[0].client_config.ca_bundle
        token = core.create_namespaced_service_account_token("arbiter", namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
        sa_kubeconfig = control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token, namespace=namespace)

        body = example()
        with OperatorProcess(sa_kubeconfig, [namespace], log_dir=tmp_path / "operator") as operator:
            objs.create_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", body)

            def reconciled():
                dm = objs.get_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels",
                                                       body["metadata"]["name"])
                status = dm.get("status") or {}
                return bool(status.get("conditions")) and status.get("observedGeneration") == \
                    dm["metadata"]["generation"], status
            status = wait_for("DecisionModel reconciled", reconciled, 180, olm)
            # A refused request logs as "403 Forbidden: ..." (the operator's KubeError) or kopf's APIForbiddenError;
            # a bare "403" would also match random namespace names and timestamps.
            forbidden = [line for line in operator.log().splitlines() if "forbidden" in line.lower()]
            assert not forbidden, forbidden[:5]
        assert {c["type"] for c in status["conditions"]} >= {"Ready"}
    finally:
        olm.stop()
        # OLM is gone before its CSV: remove the webhook configuration it made (it names this namespace's Service).
        admission = client.AdmissionregistrationV1Api(api)
        for conf in admission.list_validating_webhook_configuration().items:
            if any(w.client_config.service and w.client_config.service.namespace == namespace
                   for w in conf.webhooks or []):
                admission.delete_validating_webhook_configuration(conf.metadata.name)
        for plural, ns in (("subscriptions", namespace), ("clusterserviceversions", namespace),
                           ("catalogsources", "olm")):
            for item in objs.list_namespaced_custom_object(OLM_GROUP, "v1alpha1", ns, plural)["items"]:
                objs.delete_namespaced_custom_object(OLM_GROUP, "v1alpha1", ns, plural, item["metadata"]["name"])
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
