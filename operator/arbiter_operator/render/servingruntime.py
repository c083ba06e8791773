"""The ServingRuntime for the Arbiter runtime image.

One ServingRuntime per DecisionModel, owned by it (`<dm>-runtime`): a shared runtime would couple unrelated models'
upgrades; ownership also lets garbage collection remove it with the DecisionModel. Its image is only the template's:
each InferenceService names the image its version runs (pinned when the version was deployed, see the planner), so
changing the default never restarts a serving version. KServe appends the InferenceService's `args` to the runtime
container's, so the runtime carries no args: all of them are the `vllm serve` arguments rendered per version.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DEFAULT_RUNTIME_IMAGE, DecisionModel
from ..api.names import SERVINGRUNTIME_API
from .common import SERVING_PORT, SERVING_PORT_NAME, metadata, runtime_name

MODEL_FORMAT = "vLLM"


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
        "annotations": {
            "prometheus.io/port": str(SERVING_PORT),
            "prometheus.io/path": "/metrics",
        },
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
        annotations={"openshift.io/display-name": f"Arbiter runtime for {dm.metadata.name}"},
    )
    meta["labels"]["opendatahub.io/dashboard"] = "true"  # the dashboard shows a deployment's runtime by this label
    return {"apiVersion": SERVINGRUNTIME_API, "kind": "ServingRuntime", "metadata": meta, "spec": spec}
