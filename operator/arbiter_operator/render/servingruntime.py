"""The ServingRuntime for the Arbiter runtime image.

One ServingRuntime per DecisionModel, owned by it (`<dm>-runtime`): a shared runtime would couple unrelated models'
upgrades; ownership also lets garbage collection remove it with the DecisionModel. Its image is only the template's:
each InferenceService names the image its version runs (pinned when the version was deployed, see the planner), so
changing the default never restarts a serving version. KServe appends the InferenceService's `args` to the runtime
container's, so the runtime carries no args: all of them are the `vllm serve` arguments rendered per version.

What OpenShift AI's dashboard and odh-model-controller read of it (docs/install.md, "Beside OpenShift AI"):
- `opendatahub.io/template-display-name` and `opendatahub.io/template-name` name the runtime in the dashboard (it
  shows "Unknown Serving Runtime" without them), `opendatahub.io/apiProtocol` the protocol it lists, and
  `opendatahub.io/recommended-accelerators` the accelerator;
- `spec.annotations` `opendatahub.io/kserve-runtime: vllm` makes odh-model-controller offer its vLLM metrics page
  (the runtime re-exports vLLM's series, labelled with the InferenceService's name as that page asks);
- no `prometheus.io/*` in `spec.annotations`: odh-model-controller would make a metrics Service and ServiceMonitor
  for each InferenceService from them, a second scrape of what the DecisionModel's PodMonitor already scrapes (with
  the token the runtime asks for when auth is on, the vLLM endpoint and the version labels the analysis selects by):
  every decision series would be counted twice in sums over the fleet.
`spec.annotations` reach the predictor pods (KServe copies them onto the pod template), so changing them rolls the
pods of every version once.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DEFAULT_RUNTIME_IMAGE, DecisionModel
from ..api.names import SERVINGRUNTIME_API
from .common import SERVING_PORT, SERVING_PORT_NAME, metadata, runtime_name

MODEL_FORMAT = "vLLM"
TEMPLATE_NAME = "arbiter-runtime"  # no OpenShift Template carries it: the dashboard shows the display name alone
TEMPLATE_DISPLAY_NAME = "Arbiter decision runtime (vLLM)"
# OpenShift AI's dashboard and odh-model-controller read these (see the module docstring).
DASHBOARD_ANNOTATIONS = {
    "opendatahub.io/template-name": TEMPLATE_NAME,
    "opendatahub.io/template-display-name": TEMPLATE_DISPLAY_NAME,
    "opendatahub.io/apiProtocol": "REST",
    "opendatahub.io/recommended-accelerators": '["nvidia.com/gpu"]',
}
KSERVE_RUNTIME_ANNOTATION = "opendatahub.io/kserve-runtime"


def render_servingruntime(dm: DecisionModel, default_image: str = DEFAULT_RUNTIME_IMAGE) -> dict[str, Any]:
    serving = dm.spec.serving
    image = serving.runtimeImage or default_image
    container = {
        "name": "kserve-container",
        "image": image,
        "command": ["arbiter-runtime"],
        "ports": [{"containerPort": SERVING_PORT, "name": SERVING_PORT_NAME, "protocol": "TCP"}],
    }
    spec: dict[str, Any] = {
        "supportedModelFormats": [{"name": MODEL_FORMAT, "autoSelect": False}],
        "multiModel": False,
        "protocolVersions": ["v2"],
        # odh-model-controller's vLLM metrics page for the version's InferenceService (its ConfigMap says supported).
        "annotations": {KSERVE_RUNTIME_ANNOTATION: "vllm"},
        "containers": [container],
    }
    if serving.nodes > 1:
        # KServe's multi-node serving needs a worker template on the runtime too; the worker joins the head's Ray.
        spec["workerSpec"] = {
            "containers": [
                {
                    "name": "worker-container",
                    "image": image,
                    "command": ["arbiter-runtime", "worker"],
                }
            ]
        }
    meta = metadata(
        dm,
        runtime_name(dm.metadata.name),
        "runtime",
        annotations={"openshift.io/display-name": f"Arbiter runtime for {dm.metadata.name}", **DASHBOARD_ANNOTATIONS},
    )
    meta["labels"]["opendatahub.io/dashboard"] = "true"  # the dashboard shows a deployment's runtime by this label
    return {"apiVersion": SERVINGRUNTIME_API, "kind": "ServingRuntime", "metadata": meta, "spec": spec}
