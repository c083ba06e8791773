"""Names, labels and owner references shared by every child manifest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api import names
from ..api.models import DecisionModel, isvc_name
from ..api.names import ANN_CONFIG_CHECKSUM as ANN_CONFIG_CHECKSUM  # these `X as X`: re-exported for the renderers
from ..api.names import API_VERSION, KIND
from ..api.names import FIELD_MANAGER as FIELD_MANAGER
from ..api.names import LABEL_COMPONENT as LABEL_COMPONENT
from ..api.names import LABEL_DM as LABEL_DM
from ..api.names import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from ..api.names import LABEL_PART_OF as LABEL_PART_OF
from ..api.names import LABEL_VERSION as LABEL_VERSION
from ..api.names import MANAGED_BY as MANAGED_BY

# The runtime container: the decision server listens here (KServe's predictor Service targets it) and vLLM listens
# on VLLM_PORT inside the pod only.
SERVING_PORT = 8080
SERVING_PORT_NAME = "http1"  # the runtime container's port name (KServe's convention); the PodMonitor scrapes it
VLLM_PORT = 8000
CONFIG_DIR = "/etc/arbiter/decision"
CONFIG_FILE = names.CONFIG_FILE
# The stable version's mirroring settings during a shadow phase; read live by the runtime, so it is left out of the
# pod-template checksum: switching shadowing on or off never restarts a serving pod.
SHADOW_FILE = "shadow.json"
# The contexts pinned to versions (spec.routing): read live too, so a change of routes never restarts a pod.
ROUTING_FILE = "routing.json"
LIVE_FILES = frozenset({SHADOW_FILE, ROUTING_FILE})
MODEL_DIR = "/mnt/models"  # where KServe's storage initializer (or modelcar) puts the weights


def runtime_name(dm_name: str) -> str:
    return f"{dm_name}-runtime"


def configmap_name(dm_name: str, version: str) -> str:
    return f"{isvc_name(dm_name, version)}-decision"


def predictor_service(dm_name: str, version: str) -> str:
    """KServe (RawDeployment) names the predictor Service `<isvc>-predictor`."""
    return f"{isvc_name(dm_name, version)}-predictor"


def base_labels(dm: DecisionModel, component: str, version: str | None = None) -> dict[str, str]:
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: "arbiter",
        LABEL_DM: dm.metadata.name,
        LABEL_COMPONENT: component,
    }
    if version is not None:
        labels[LABEL_VERSION] = version
    return labels


def owner_reference(dm: DecisionModel) -> dict[str, Any]:
    # controller=true lets `kubectl get -o wide` and GC treat the DecisionModel as the one owner; blockOwnerDeletion
    # is left out because it needs delete permission on the owner, which the operator's role need not have.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": dm.metadata.name,
        "uid": dm.metadata.uid,
        "controller": True,
    }


def metadata(dm: DecisionModel, name: str, component: str, version: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": dm.metadata.namespace,
        "labels": base_labels(dm, component, version),
        "ownerReferences": [owner_reference(dm)],
    }
    meta.update(extra)
    return meta


def checksum(obj: Any) -> str:
    """A stable digest of JSON-able data (sorted keys), used to roll pods when their config changes."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
