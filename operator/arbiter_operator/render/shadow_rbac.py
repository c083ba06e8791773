"""The one grant a shadow phase needs when auth is on: the stable version's pods may call the candidate.

The stable runtime mirrors requests to the candidate's predictor Service with its pod's ServiceAccount token; the
candidate's runtime (and OpenShift AI's authenticating proxy) let a caller through when it may `get` the candidate's
InferenceService. So, only while a shadow phase runs, a Role grants exactly that (`get` on the one InferenceService,
by name) to the predictor pods' ServiceAccount, and a RoleBinding binds it; both are owned by the DecisionModel and
deleted when the shadow phase ends. Without auth nothing is rendered: nothing checks the caller.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DecisionModel, isvc_name
from ..api.names import RBAC_API
from .common import metadata

COMPONENT = "shadow-caller"
# KServe's predictor pods run as the namespace's `default` ServiceAccount: the InferenceService names no other.
PREDICTOR_SERVICE_ACCOUNT = "default"


def shadow_rbac_name(dm_name: str) -> str:
    return f"{dm_name}-shadow"


def render_shadow_rbac(dm: DecisionModel, candidate: str) -> list[dict[str, Any]]:
    name = shadow_rbac_name(dm.metadata.name)
    role = {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": metadata(dm, name, COMPONENT),
        "rules": [
            {
                "apiGroups": ["serving.kserve.io"],
                "resources": ["inferenceservices"],
                "resourceNames": [isvc_name(dm.metadata.name, candidate)],
                "verbs": ["get"],
            }
        ],
    }
    binding = {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": metadata(dm, name, COMPONENT),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": PREDICTOR_SERVICE_ACCOUNT, "namespace": dm.metadata.namespace}
        ],
    }
    return [role, binding]
