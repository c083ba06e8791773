"""The OLM bundle is the chart and the models in OLM's shape: generated, never drifting, validated by the Operator
Framework's own validator (built from its Go module), its permissions exactly the chart's RBAC."""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import subprocess

import pytest
import yaml
from arbiter_devenv import olmbundle
from arbiter_devenv.tools import ensure_tool
from kubernetes import client
from support.paths import REPO

ROOT = REPO
BUNDLE = ROOT / "bundle"
CSV_FILE = BUNDLE / "manifests" / f"{olmbundle.PACKAGE}.clusterserviceversion.yaml"


def load(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text())


def canonical(rules: list[dict]) -> list[str]:
    """Rules as comparable strings: order of rules and of list entries does not change what a Role grants."""
    return sorted(json.dumps({k: sorted(v) if isinstance(v, list) else v for k, v in r.items()}, sort_keys=True)
                  for r in rules)


def test_bundle_and_catalog_are_what_the_sources_generate():
    assert olmbundle.main(["--check"]) == 0, "run: python -m arbiter_devenv.olmbundle"


def test_csv_permissions_equal_the_charts_rbac():
    from support.helm_render import render  # the real helm binary on the chart

    spec = load(CSV_FILE)["spec"]["install"]["spec"]
    namespaced = spec["permissions"][0]["rules"]
    cluster = spec["clusterPermissions"][0]["rules"]
    all_ns = render({})
    chart_cluster_role = next(d for d in all_ns if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "arbiter")
    # The chart's leader-election Role (the Lease, in the release namespace) travels in `permissions`, which OLM
    # grants in the operator's namespace.
    leader = next(d for d in all_ns if d["kind"] == "Role" and d["metadata"]["name"] == "arbiter-leader-election")
    assert all(r in namespaced for r in leader["rules"])
    namespaced = [r for r in namespaced if r not in leader["rules"]]
    # AllNamespaces: OLM grants permissions cluster-wide too, so together they must be the chart's ClusterRole.
    assert canonical(namespaced + cluster) == canonical(chart_cluster_role["rules"])
    listed = render({"watchedNamespaces": ["team-a", "team-b"]})
    roles = [d for d in listed if d["kind"] == "Role" and d["metadata"]["name"] != "arbiter-leader-election"]
    assert len(roles) == 2 and all(canonical(r["rules"]) == canonical(namespaced) for r in roles)
    # The one cluster rule (namespace labels) is the chart's, minus resourceNames OLM cannot know at build time.
    chart_cluster = next(d for d in listed if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "arbiter")
    assert canonical([{k: v for k, v in r.items() if k != "resourceNames"} for r in chart_cluster["rules"]]) \
        == canonical(cluster)
    assert all(d["spec"]["install"]["spec"]["permissions"][0]["serviceAccountName"] == "arbiter" for d in [
        load(CSV_FILE)])


def test_csv_deployment_is_the_charts_with_olms_namespaces():
    from support.helm_render import render

    chart_dep = next(d for d in render(olmbundle.OLM_VALUES) if d["kind"] == "Deployment")
    csv = load(CSV_FILE)
    dep = csv["spec"]["install"]["spec"]["deployments"][0]["spec"]
    ours, theirs = dep["template"]["spec"], chart_dep["spec"]["template"]["spec"]
    assert ours["securityContext"] == theirs["securityContext"]
    c, h = ours["containers"][0], theirs["containers"][0]
    for key in ("image", "args", "securityContext", "resources", "livenessProbe", "startupProbe", "volumeMounts"):
        assert c[key] == h[key], key
    # The chart's replicas and rollout: replicas elect a leader, so an upgrade may run old and new pods side by side.
    assert dep["strategy"] == chart_dep["spec"]["strategy"] and dep["replicas"] == chart_dep["spec"]["replicas"] == 2
    # ... spread over nodes, by a selector that matches the pods OLM's Deployment makes (its labels, not the chart's).
    (spread,) = ours["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"].items() <= dep["template"]["metadata"]["labels"].items()
    assert dep["selector"]["matchLabels"].items() <= dep["template"]["metadata"]["labels"].items()
    perms = csv["spec"]["install"]["spec"]["permissions"][0]["rules"]
    leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    assert leases in perms
    env = {e["name"]: e for e in c["env"]}
    assert env["ARBITER_NAMESPACES"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['olm.targetNamespaces']"
    images = {i["name"]: i["image"] for i in csv["spec"]["relatedImages"]}
    assert images["operator"] == c["image"] and images["runtime"] == env["ARBITER_RUNTIME_IMAGE"]["value"]
    ann = csv["metadata"]["annotations"]
    # Disconnected installs mirror by digest: claimed only when every related image is pinned by one.
    assert ann["features.operators.openshift.io/disconnected"] == str(
        all("@sha256:" in i for i in images.values())).lower()
    assert {m["type"] for m in csv["spec"]["installModes"] if m["supported"]} == {
        "OwnNamespace", "SingleNamespace", "MultiNamespace", "AllNamespaces"}


def test_owned_crd_is_the_models_crd_with_descriptors_that_exist():
    crd = load(BUNDLE / "manifests" / "arbiter.dev_decisionmodels.yaml")
    assert crd == load(ROOT / "crds" / "arbiter.dev_decisionmodels.yaml")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    owned = load(CSV_FILE)["spec"]["customresourcedefinitions"]["owned"][0]
    for section, descriptors in (("spec", owned["specDescriptors"]), ("status", owned["statusDescriptors"])):
        for d in descriptors:
            node = schema[section]
            for part in d["path"].split("."):
                node = node["properties"][part]  # a descriptor naming a field the CRD lacks fails here
    assert owned["name"] == crd["metadata"]["name"] and owned["version"] == crd["spec"]["versions"][0]["name"]


def test_catalog_names_the_bundle_and_carries_its_objects():
    docs = list(yaml.safe_load_all((ROOT / "catalog" / olmbundle.PACKAGE / "catalog.yaml").read_text()))
    by_schema = {d["schema"]: d for d in docs if d}
    pkg, channel, bundle = by_schema["olm.package"], by_schema["olm.channel"], by_schema["olm.bundle"]
    csv = load(CSV_FILE)
    assert pkg["defaultChannel"] == channel["name"] and channel["entries"] == [{"name": csv["metadata"]["name"]}]
    objects = [json.loads(base64.b64decode(p["value"]["data"])) for p in bundle["properties"]
               if p["type"] == "olm.bundle.object"]
    assert csv in objects and load(BUNDLE / "manifests" / "arbiter.dev_decisionmodels.yaml") in objects
    annotations = load(BUNDLE / "metadata" / "annotations.yaml")["annotations"]
    assert annotations["operators.operatorframework.io.bundle.channels.v1"] == channel["name"]
    dockerfile = (ROOT / "bundle.Dockerfile").read_text()
    assert all(f"LABEL {k}={v}" in dockerfile for k, v in annotations.items())


def validate(bundle: pathlib.Path) -> tuple[int, list[dict]]:
    proc = subprocess.run([str(ensure_tool("operator-bundle-validator")), "--k8s-version", "1.34", str(bundle)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_operator_framework_validator_passes_the_bundle_without_warnings():
    code, results = validate(BUNDLE)
    assert code == 0 and results == [], json.dumps(results, indent=2)


def test_operator_framework_validator_catches_a_broken_csv(tmp_path):
    broken = tmp_path / "bundle"
    shutil.copytree(BUNDLE, broken)
    path = broken / "manifests" / CSV_FILE.name
    csv = load(path)
    csv["spec"]["customresourcedefinitions"]["owned"][0]["version"] = "v9"  # not a version the CRD serves
    csv["spec"]["installModes"] = []
    path.write_text(yaml.safe_dump(csv))
    code, results = validate(broken)
    assert code == 1
    errors = " ".join(e["message"] for r in results for e in r["errors"])
    assert "v9" in errors or "installModes" in errors


@pytest.mark.cluster
def test_alm_examples_are_accepted_by_the_crd(control_plane, namespace):
    """The examples OperatorHub offers in its create form pass the real apiserver's validation (dry run)."""
    examples = json.loads(load(CSV_FILE)["metadata"]["annotations"]["alm-examples"])
    api = control_plane.api_client()
    try:
        objs = client.CustomObjectsApi(api)
        for example in examples:
            objs.create_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", example,
                                                 dry_run="All")
    finally:
        api.close()
    assert len(examples) == len(list((ROOT / "examples").glob("*.yaml")))


def test_a_chart_rbac_change_reaches_the_csv_and_the_drift_check(tmp_path):
    """Widening the chart's Role changes the generated CSV: the committed bundle then fails --check."""
    root = tmp_path / "repo"
    for part in ("helm", "crds", "examples"):
        shutil.copytree(ROOT / part, root / part)
    helpers = root / "helm" / "arbiter" / "templates" / "_helpers.tpl"
    helpers.write_text(helpers.read_text().replace(
        '  resources: ["decisionmodels/status"]\n  verbs: ["patch"]',
        '  resources: ["decisionmodels/status"]\n  verbs: ["patch", "update"]', 1))
    changed = olmbundle.render(root)
    committed = olmbundle.render(ROOT)
    csv_path = f"bundle/manifests/{olmbundle.PACKAGE}.clusterserviceversion.yaml"
    assert changed[csv_path] != committed[csv_path]
    rules = yaml.safe_load(changed[csv_path])["spec"]["install"]["spec"]["permissions"][0]["rules"]
    assert {"resources": ["decisionmodels/status"], "verbs": ["patch", "update"], "apiGroups": ["arbiter.dev"]} in rules
