"""The ServingRuntime for the Arbiter runtime image.

One ServingRuntime per DecisionModel, owned by it (`<dm>-runtime`): the runtime image is a per-DecisionModel setting
(spec.serving.runtimeImage), so a shared runtime would couple unrelated models' upgrades; ownership also lets
garbage collection remove it with the DecisionModel. KServe appends the InferenceService's `args` to the runtime
container's, so the runtime carries no args: all of them are the `vllm serve` arguments rendered per version.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DecisionModel
from .common import SERVING_PORT, SERVING_PORT_NAME, metadata, runtime_name

MODEL_FORMAT = "vLLM"


def render_servingruntime(dm: DecisionModel) -> dict[str, Any]:
    serving = dm.spec.serving
    container = {
        "name": "kserve-container",
        "image": serving.runtimeImage,
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
                    "image": serving.runtimeImage,
                    "command": ["arbiter-runtime", "worker"],
                }
            ]
        }
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": metadata(
            dm,
            runtime_name(dm.metadata.name),
            "runtime",
            annotations={"openshift.io/display-name": f"Arbiter runtime for {dm.metadata.name}"},
        ),
        "spec": spec,
    }
