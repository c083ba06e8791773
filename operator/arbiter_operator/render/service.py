"""One stable in-cluster Service per DecisionModel, named after it, that selects the pods of the stable version.

KServe gives each InferenceService its own `<isvc>-predictor` Service, which changes name with every version; clients
inside the cluster want one address that follows promotions, as KServe's `status.address.url` does for one
InferenceService. The selector names the version that holds the most traffic (the stable one during a canary), so a
promotion moves this Service when it moves the Route's main backend, and only to a version KServe reports ready.
Port 80 goes to the runtime's own port (8080), which checks bearer tokens itself when auth is on.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DecisionModel
from ..api.names import CORE_API
from .common import LABEL_COMPONENT, LABEL_DM, LABEL_VERSION, SERVING_PORT, metadata

SERVICE_PORT = 80


def stable_service_name(dm_name: str) -> str:
    return dm_name


def stable_service_url(dm: DecisionModel) -> str:
    return f"http://{stable_service_name(dm.metadata.name)}.{dm.metadata.namespace}.svc.cluster.local"


def render_stable_service(dm: DecisionModel, version: str) -> dict[str, Any]:
    return {
        "apiVersion": CORE_API,
        "kind": "Service",
        "metadata": metadata(dm, stable_service_name(dm.metadata.name), "stable-service", version),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_DM: dm.metadata.name, LABEL_VERSION: version, LABEL_COMPONENT: "predictor"},
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": SERVING_PORT, "protocol": "TCP"}],
        },
    }
