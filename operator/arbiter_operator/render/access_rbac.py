"""spec.access as RBAC: one Role granting `get` on the model's live InferenceServices (by name) and one RoleBinding to
the callers spec.access lists (pure).

The runtime (and OpenShift AI's authenticating proxy) lets a caller through when it may `get` the InferenceService of
the version answering; a version's InferenceService is named after the version, so a grant by name would break at
every promotion. The operator renders the Role from the versions live in this pass: a version's name is in it from the
pass that creates its InferenceService to the pass that deletes it, so a caller allowed before a promotion is allowed
during and after it. The operator holds that `get` itself: creating the Role and binding it needs neither `escalate`
nor `bind`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..api.models import DecisionModel, isvc_name
from ..api.names import RBAC_API
from .common import metadata

COMPONENT = "callers"


def callers_name(dm_name: str) -> str:
    return f"{dm_name}-callers"


def render_access_rbac(dm: DecisionModel, versions: Iterable[str]) -> list[dict[str, Any]]:
    """The Role and RoleBinding, or nothing: without spec.access, without a caller, or without a live version (a
    Role with no resourceNames would grant `get` on every InferenceService of the namespace)."""
    access = dm.spec.access
    names = sorted({isvc_name(dm.metadata.name, v) for v in versions})
    subjects = access.subjects(dm.metadata.namespace) if access is not None else []
    if not names or not subjects:
        return []
    name = callers_name(dm.metadata.name)
    role = {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": metadata(dm, name, COMPONENT),
        "rules": [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "resourceNames": names,
                   "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": metadata(dm, name, COMPONENT),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects,
    }
    return [role, binding]
