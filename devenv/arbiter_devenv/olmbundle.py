"""`python -m arbiter_devenv.olmbundle [--check] [--operator-image REF] [--runtime-image REF] [--bundle-image REF]
[--out DIR]`: the OLM bundle and file-based catalog, generated.

One source of truth, three outputs: the chart (Helm), `bundle/` (OLM's registry+v1 bundle: a ClusterServiceVersion,
the CRD, the metrics Service, the metrics-reader ClusterRole, the alerts' PrometheusRule,
metadata/annotations.yaml), `bundle.Dockerfile`, and
`catalog/` (a file-based catalog: olm.package, olm.channel, olm.bundle). Nothing in them is written by hand:
- the CRD is the file the pydantic models generate (crds/, `python -m arbiter_operator.api.crdgen`);
- the RBAC and the Deployment are the chart's own templates, rendered by the real `helm` binary: the namespaced rules
  (the chart's per-namespace Role) become the CSV's `permissions`, which OLM grants in each target namespace (or
  cluster-wide for AllNamespaces); the cluster rules (reading the watched namespaces' labels) become
  `clusterPermissions`;
- the watched namespaces come from OLM's OperatorGroup: the pod's `olm.targetNamespaces` annotation feeds
  ARBITER_NAMESPACES ("" is all namespaces), the operator's own namespace list;
- `alm-examples` are the files in examples/.
`--check` exits 1 when a generated file differs from what is committed (tests/cluster/olm runs it).

The committed files name the chart's default images. A team builds for its own registry with the image flags (a tag,
or a digest: `registry/org/arbiter-operator@sha256:...`) and `--out`, never by editing the generated files;
`hack/release.sh` does exactly that. `features.operators.openshift.io/disconnected` is true only when the operator and
runtime images are both given by digest.
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any

import yaml
from arbiter_operator.api import models

from arbiter_devenv.generated import write_or_check
from arbiter_devenv.tools import ensure_tool, repo_root

PACKAGE = "arbiter-operator"
CHANNEL = "candidate"  # OLM's channel naming: candidate, fast, stable
BUNDLE_IMAGE_REPO = "quay.io/arbiter-dev/arbiter-operator-bundle"
CRD_NAME = f"{models.PLURAL}.{models.GROUP}"
RELEASE = "arbiter"  # the Helm release name the chart is rendered with; it names the Deployment and ServiceAccount
NAME_LABEL = "app.kubernetes.io/name"
# Which of OpenShift's infrastructure features hold (docs/install.md gives the reasons).
FEATURES = {
    "fips-compliant": "false",  # not built or tested against FIPS-validated crypto modules
    "proxy-aware": "true",  # httpx (registry, Prometheus) and botocore (S3) honour the HTTP(S)_PROXY/NO_PROXY OLM sets
    "tls-profiles": "false",  # does not read the cluster's TLS security profile
    "token-auth-aws": "false",
    "token-auth-azure": "false",
    "token-auth-gcp": "false",
    "cnf": "false",
    "cni": "false",
    "csi": "false",
}


# A reference as OCI distribution spells it: [registry[:port]/]path[:tag] or ...@sha256:<64 hex>.
_REFERENCE = re.compile(
    r"^(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


@dataclasses.dataclass(frozen=True)
class ImageRef:
    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


def parse_image(ref: str) -> ImageRef:
    """An image reference with a tag or a digest (a digest wins); anything else is refused with the reason."""
    m = _REFERENCE.match(ref)
    if not m or not (m.group("tag") or m.group("digest")):
        raise ValueError(f"{ref!r} is not an image reference with a tag or a digest "
                         "(registry/org/name:tag or registry/org/name@sha256:<64 hex digits>)")
    return ImageRef(m.group("repository"), None if m.group("digest") else m.group("tag"), m.group("digest"))


@dataclasses.dataclass(frozen=True)
class Images:
    """The images a bundle names. None: the chart's default operator image, and the bundle image
    `BUNDLE_IMAGE_REPO:v<version>`."""

    operator: ImageRef | None = None
    runtime: str = models.DEFAULT_RUNTIME_IMAGE
    bundle: str | None = None

    def chart_values(self) -> dict[str, Any]:
        """The chart's values that make it render these images."""
        if self.operator is None:
            return {}
        image = {"repository": self.operator.repository, "tag": self.operator.tag or "",
                 "digest": self.operator.digest or ""}
        return {"image": image, "runtime": {"image": self.runtime}}


DEFAULT_IMAGES = Images()


def _helm_template(chart: pathlib.Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="arbiter-olm-") as tmp:
        vals = pathlib.Path(tmp) / "values.yaml"
        vals.write_text(yaml.safe_dump(values))
        env = {**os.environ, "HELM_CACHE_HOME": f"{tmp}/c", "HELM_CONFIG_HOME": f"{tmp}/f",
               "HELM_DATA_HOME": f"{tmp}/d"}
        out = subprocess.run([str(ensure_tool("helm", quiet=True)), "template", RELEASE, str(chart), "--namespace",
                              "arbiter-system", "-f", str(vals)], capture_output=True, text=True, env=env,
                             timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _one(docs: list[dict[str, Any]], kind: str, namespaced: bool | None = None,
         name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    if namespaced is not None:
        found = [d for d in found if ("namespace" in d["metadata"]) == namespaced]
    if len(found) != 1:
        raise ValueError(f"the chart renders {len(found)} {kind} objects, expected one")
    return found[0]


def chart_rbac(chart: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(namespaced rules, cluster rules) as the chart grants them in its watched-namespaces mode."""
    docs = _helm_template(chart, {"watchedNamespaces": ["ns-placeholder"]})
    role = _one(docs, "Role", name=RELEASE)
    # The leader-election Lease lives in the operator's own namespace: OLM grants `permissions` there.
    leader = _one(docs, "Role", name=f"{RELEASE}-leader-election")
    cluster_rules = copy.deepcopy(_one(docs, "ClusterRole", name=RELEASE)["rules"])
    for rule in cluster_rules:  # OLM does not know the namespaces when the bundle is built: the rule covers all
        rule.pop("resourceNames", None)
    return role["rules"] + leader["rules"], cluster_rules


def _chart_meta(chart: pathlib.Path) -> dict[str, Any]:
    return yaml.safe_load((chart / "Chart.yaml").read_text())


# The chart rendered as OLM runs it: OLM generates the webhook's certificate, mounts it, and owns the webhook
# configuration (the CSV's webhookdefinitions), so the chart renders neither Service nor configuration.
OLM_VALUES: dict[str, Any] = {"webhook": {"certificates": "olm"}}


def deployment_spec(chart: pathlib.Path, images: Images = DEFAULT_IMAGES) -> dict[str, Any]:
    dep = _one(_helm_template(chart, {**OLM_VALUES, **images.chart_values()}), "Deployment")
    spec = copy.deepcopy(dep["spec"])
    labels = {NAME_LABEL: RELEASE, "app.kubernetes.io/component": "operator"}
    spec["selector"] = {"matchLabels": labels}
    spec["template"]["metadata"]["labels"] = dict(labels)  # a copy: no YAML anchors in the CSV
    for spread in spec["template"]["spec"].get("topologySpreadConstraints") or []:
        spread["labelSelector"] = {"matchLabels": dict(labels)}  # the replicas spread over nodes select OLM's labels
    container = spec["template"]["spec"]["containers"][0]
    # The OperatorGroup decides the namespaces: OLM writes them on the pod as an annotation.
    container["env"].insert(1, {"name": "ARBITER_NAMESPACES", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['olm.targetNamespaces']"}}})
    container["env"] = [e for e in container["env"] if e["name"] != "ARBITER_RUNTIME_IMAGE"] + [
        {"name": "ARBITER_RUNTIME_IMAGE", "value": images.runtime}]
    return spec


def _examples(root: pathlib.Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((root / "examples").glob("*.yaml"))]


def _descriptor(path: str, name: str, text: str, *xs: str) -> dict[str, Any]:
    return {"path": path, "displayName": name, "description": text, "x-descriptors": list(xs)}


SPEC_DESCRIPTORS = [
    _descriptor("model.name", "Model", "Name of the model in the registry and in the InferenceServices."),
    _descriptor("promote.version", "Wanted version", "The version that should be active.",
                "urn:alm:descriptor:com.tectonic.ui:text"),
    _descriptor("promote.strategy", "Promotion strategy", "Immediate, or Canary with analysed traffic steps.",
                "urn:alm:descriptor:com.tectonic.ui:select:Immediate",
                "urn:alm:descriptor:com.tectonic.ui:select:Canary"),
    _descriptor("serving.gpus", "GPUs per pod", "Tensor-parallel GPUs of each predictor pod.",
                "urn:alm:descriptor:com.tectonic.ui:number"),
    _descriptor("serving.replicas", "Replicas", "Replicas of each version's predictor.",
                "urn:alm:descriptor:com.tectonic.ui:podCount"),
]
STATUS_DESCRIPTORS = [
    _descriptor("conditions", "Conditions", "Ready, Serving, Reconciling, Stalled, Degraded and their reasons.",
                "urn:alm:descriptor:io.kubernetes.conditions"),
    _descriptor("activeVersion", "Active version", "Version that holds (most of) the traffic.",
                "urn:alm:descriptor:text"),
    _descriptor("promotion.phase", "Promotion phase", "Idle, Deploying, Waiting, Progressing, Failed, ...",
                "urn:alm:descriptor:text"),
    _descriptor("promotion.candidate", "Candidate", "Version being promoted.", "urn:alm:descriptor:text"),
    _descriptor("promotion.weight", "Candidate traffic (%)", "Percent of traffic the candidate receives now.",
                "urn:alm:descriptor:text"),
    _descriptor("promotion.failureReason", "Failure reason", "Why the last promotion failed.",
                "urn:alm:descriptor:text"),
    _descriptor("url", "URL", "The Route's URL.", "urn:alm:descriptor:org.w3:link"),
]


# A balance: the decision between versions.
ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect width="64" height="64" rx="12" fill="#1f3a5f"/>'
    '<path d="M32 12v40M18 52h28M12 22h40M12 22l-6 14h12zM52 22l-6 14h12z" stroke="#f2c14e" stroke-width="3" '
    'fill="none" stroke-linejoin="round"/></svg>'
)
DESCRIPTION = """Arbiter runs decision models (risk, underwriting, pricing, fraud) on vLLM inside OpenShift AI.

A team declares one `DecisionModel` per decision service (`oc apply -f`, or through Argo CD). The operator records each
version in the Model Registry, runs a KServe InferenceService per live version with vLLM on tensor-parallel GPU pods,
keeps one stable Route, and switches versions through `spec.promote`: both versions warm, the candidate analysed
against Prometheus, rolled back by itself when it fails.

**Before you install**: Red Hat OpenShift AI (KServe) and, for promotions with analysis, user-workload monitoring.

**Watched namespaces** follow the OperatorGroup: own namespace, a list of namespaces, or all namespaces.

`kubectl arbiter status NAME` (the release's kubectl-arbiter archive, or krew) shows a promotion's phase, traffic and
last analysis.
"""


def _digest_pinned(image: str) -> bool:
    return "@sha256:" in image


def webhook_definitions(chart: pathlib.Path) -> list[dict[str, Any]]:
    """The chart's ValidatingWebhookConfiguration as OLM's webhookdefinitions (OLM scopes it to the OperatorGroup's
    namespaces, issues its certificate and serves it through a Service of its own to the container's port)."""
    values = yaml.safe_load((chart / "values.yaml").read_text())["webhook"]
    hook = _one(_helm_template(chart, {}), "ValidatingWebhookConfiguration")["webhooks"][0]
    return [{
        "type": "ValidatingAdmissionWebhook",
        "generateName": hook["name"],
        "deploymentName": RELEASE,
        "containerPort": 443,
        "targetPort": values["port"],
        "webhookPath": hook["clientConfig"]["service"]["path"],
        "rules": hook["rules"],
        "failurePolicy": hook["failurePolicy"],
        "sideEffects": hook["sideEffects"],
        "admissionReviewVersions": hook["admissionReviewVersions"],
        "matchPolicy": hook["matchPolicy"],
        "timeoutSeconds": hook["timeoutSeconds"],
    }]


def csv(root: pathlib.Path, given: Images = DEFAULT_IMAGES) -> dict[str, Any]:
    chart = root / "helm" / "arbiter"
    meta = _chart_meta(chart)
    version = meta["appVersion"]
    spec = deployment_spec(chart, given)
    operator_image = spec["template"]["spec"]["containers"][0]["image"]
    images = [{"name": "operator", "image": operator_image}, {"name": "runtime", "image": given.runtime}]
    namespaced_rules, cluster_rules = chart_rbac(chart)
    crd = yaml.safe_load((root / "crds" / f"{models.GROUP}_{models.PLURAL}.yaml").read_text())
    account = RELEASE
    annotations = {
        "alm-examples": json.dumps(_examples(root)),
        "capabilities": "Deep Insights",
        "categories": "AI/Machine Learning",
        "containerImage": operator_image,
        "description": meta["description"].strip(),
        "repository": meta["sources"][0],
        "support": "Arbiter project",
        "operatorframework.io/suggested-namespace": "arbiter-system",
        # Disconnected (mirrored) installs need every image by digest: true only when relatedImages are pinned.
        "features.operators.openshift.io/disconnected": str(all(_digest_pinned(i["image"]) for i in images)).lower(),
        **{f"features.operators.openshift.io/{k}": v for k, v in FEATURES.items()},
    }
    return {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {"name": f"{PACKAGE}.v{version}", "namespace": "placeholder", "annotations": annotations},
        "spec": {
            "displayName": "Arbiter",
            "description": DESCRIPTION,
            "version": version,
            "minKubeVersion": meta["kubeVersion"].lstrip(">=").split("-")[0],
            "maturity": "alpha",
            "icon": [{"base64data": base64.b64encode(ICON_SVG.encode()).decode(), "mediatype": "image/svg+xml"}],
            "provider": {"name": "Arbiter project"},
            "maintainers": [{"name": "Arbiter maintainers", "email": "maintainers@arbiter.dev"}],
            "links": [{"name": "Source", "url": meta["sources"][0]}, {"name": "Website", "url": meta["home"]}],
            "keywords": meta["keywords"],
            "labels": {"operated-by": PACKAGE},
            "selector": {"matchLabels": {"operated-by": PACKAGE}},
            "installModes": [
                {"type": "OwnNamespace", "supported": True},
                {"type": "SingleNamespace", "supported": True},
                {"type": "MultiNamespace", "supported": True},
                {"type": "AllNamespaces", "supported": True},
            ],
            "customresourcedefinitions": {"owned": [{
                "name": CRD_NAME, "version": models.VERSION, "kind": models.KIND, "displayName": "Decision Model",
                "description": crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get(
                    "description", "A decision model, its versions and its promotion, served by vLLM on KServe."),
                "resources": [{"kind": k, "version": v, "name": ""} for k, v in (
                    ("InferenceService", "v1beta1"), ("Route", "v1"), ("Service", "v1"))],
                "specDescriptors": SPEC_DESCRIPTORS,
                "statusDescriptors": STATUS_DESCRIPTORS,
            }]},
            "install": {"strategy": "deployment", "spec": {
                "permissions": [{"serviceAccountName": account, "rules": namespaced_rules}],
                "clusterPermissions": [{"serviceAccountName": account, "rules": cluster_rules}],
                "deployments": [{"name": RELEASE, "label": {NAME_LABEL: RELEASE}, "spec": spec}],
            }},
            "webhookdefinitions": webhook_definitions(chart),
            "relatedImages": images,
        },
    }


def metrics_service(root: pathlib.Path) -> dict[str, Any]:
    """The chart's metrics Service, with its annotations: on OpenShift the service CA writes the metrics endpoint's
    certificate into the Secret the CSV's Deployment mounts, as it does for the chart."""
    svc = copy.deepcopy(_one(_helm_template(root / "helm" / "arbiter", OLM_VALUES), "Service"))
    annotations = svc["metadata"].get("annotations")
    svc["metadata"] = {"name": f"{RELEASE}-metrics", "labels": {NAME_LABEL: RELEASE},
                       **({"annotations": annotations} if annotations else {})}
    svc["spec"]["selector"] = {NAME_LABEL: RELEASE, "app.kubernetes.io/component": "operator"}
    return svc


def metrics_reader(root: pathlib.Path) -> dict[str, Any]:
    """The chart's metrics-reader ClusterRole (`get` on /metrics): what a scraper of the operator's metrics, and of
    the runtimes' with auth on, is bound to. OLM installs a bundle's ClusterRole as it is."""
    role = copy.deepcopy(_one(_helm_template(root / "helm" / "arbiter", OLM_VALUES), "ClusterRole",
                              name=f"{RELEASE}-metrics-reader"))
    role["metadata"] = {"name": role["metadata"]["name"], "labels": {NAME_LABEL: RELEASE}}
    return role


def prometheus_rule(root: pathlib.Path) -> dict[str, Any]:
    """The chart's PrometheusRule (alerts on the operator and the DecisionModels' status), as OLM installs it in the
    operator's namespace. A ServiceMonitor is not in the bundle: its TLS server name and its reader's binding name the
    install namespace, which a bundle cannot know (docs/install.md says how to add one)."""
    values = {**OLM_VALUES, "alerts": {"enabled": True}}
    rule = copy.deepcopy(_one(_helm_template(root / "helm" / "arbiter", values), "PrometheusRule"))
    rule["metadata"] = {"name": RELEASE, "labels": {NAME_LABEL: RELEASE}}
    return rule


def bundle_annotations() -> dict[str, str]:
    return {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": PACKAGE,
        "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
        "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
    }


HEADER = "# Generated by `python -m arbiter_devenv.olmbundle` from the chart, crds/, examples/. Do not edit.\n"


def _yaml(doc: Any) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def render(root: pathlib.Path, images: Images = DEFAULT_IMAGES) -> dict[str, str]:
    """Relative path -> file content, for every generated file."""
    the_csv = csv(root, images)
    version = the_csv["spec"]["version"]
    crd_text = (root / "crds" / f"{models.GROUP}_{models.PLURAL}.yaml").read_text()
    service = metrics_service(root)
    reader = metrics_reader(root)
    alerts = prometheus_rule(root)
    files = {
        f"bundle/manifests/{PACKAGE}.clusterserviceversion.yaml": _yaml(the_csv),
        f"bundle/manifests/{models.GROUP}_{models.PLURAL}.yaml": crd_text,
        f"bundle/manifests/{RELEASE}-metrics_v1_service.yaml": _yaml(service),
        f"bundle/manifests/{RELEASE}-metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml": _yaml(reader),
        f"bundle/manifests/{RELEASE}_monitoring.coreos.com_v1_prometheusrule.yaml": _yaml(alerts),
        "bundle/metadata/annotations.yaml": _yaml({"annotations": bundle_annotations()}),
    }
    labels = "".join(f"LABEL {k}={v}\n" for k, v in bundle_annotations().items())
    files["bundle.Dockerfile"] = (
        "# Generated by `python -m arbiter_devenv.olmbundle`. Do not edit.\n"
        "# The OLM bundle image: podman build -f bundle.Dockerfile -t <registry>/arbiter-operator-bundle:vX .\n"
        f"FROM scratch\n\n{labels}\nCOPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n")
    bundle_image = images.bundle or f"{BUNDLE_IMAGE_REPO}:v{version}"
    objects = [the_csv, yaml.safe_load(crd_text), service, reader, alerts]
    catalog = [
        {"schema": "olm.package", "name": PACKAGE, "defaultChannel": CHANNEL,
         "description": the_csv["metadata"]["annotations"]["description"]},
        {"schema": "olm.channel", "package": PACKAGE, "name": CHANNEL,
         "entries": [{"name": the_csv["metadata"]["name"]}]},
        {"schema": "olm.bundle", "name": the_csv["metadata"]["name"], "package": PACKAGE, "image": bundle_image,
         "relatedImages": [{"name": "bundle", "image": bundle_image}, *the_csv["spec"]["relatedImages"]],
         "properties": [
             {"type": "olm.package", "value": {"packageName": PACKAGE, "version": version}},
             {"type": "olm.gvk", "value": {"group": models.GROUP, "kind": models.KIND, "version": models.VERSION}},
             *({"type": "olm.bundle.object", "value": {"data": base64.b64encode(
                 json.dumps(o, sort_keys=True).encode()).decode()}} for o in objects),
         ]},
    ]
    # No "---" before the first document: opm reads a comment-only document as an object without a schema.
    files[f"catalog/{PACKAGE}/catalog.yaml"] = HEADER + "---\n".join(
        yaml.safe_dump(doc, sort_keys=False, width=120) for doc in catalog)
    return files


def images_from(operator: str | None, runtime: str | None, bundle: str | None) -> Images:
    """Images from the command line's references (each checked: a tag or a digest); None keeps the default."""
    if runtime is not None:
        parse_image(runtime)
    if bundle is not None:
        parse_image(bundle)
    if operator is None and runtime is not None:
        raise ValueError("--runtime-image needs --operator-image: the bundle names both or neither")
    return Images(operator=parse_image(operator) if operator else None,
                  runtime=runtime or models.DEFAULT_RUNTIME_IMAGE, bundle=bundle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file differs from the sources")
    parser.add_argument("--operator-image", help="the operator image (a tag or a digest); default: the chart's")
    parser.add_argument("--runtime-image", help="the runtime image the operator deploys (a tag or a digest)")
    parser.add_argument("--bundle-image", help=f"the bundle image the catalog names; default {BUNDLE_IMAGE_REPO}:vX")
    parser.add_argument("--out", type=pathlib.Path, help="write under this folder instead of the repository")
    args = parser.parse_args(argv)
    try:
        images = images_from(args.operator_image, args.runtime_image, args.bundle_image)
    except ValueError as exc:
        parser.error(str(exc))
    root = repo_root()
    return write_or_check(render(root, images), args.check, "python -m arbiter_devenv.olmbundle", args.out or root)


if __name__ == "__main__":
    sys.exit(main())
