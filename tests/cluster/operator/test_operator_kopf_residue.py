"""What earlier builds let kopf store on a DecisionModel (a copy of the spec as diff base) is removed once, and the
operator itself never writes an annotation: a large spec's annotations stay the user's."""

from __future__ import annotations

import json

from arbiter_operator.registry_handlers import residue_patch
from support.operator_kit import create_dm, eventually, example, get

DIFF_BASE = "arbiter.dev/last-handled-configuration"


def test_residue_patch_removes_only_kopfs_keys() -> None:
    raw = {"metadata": {"resourceVersion": "7", "annotations": {DIFF_BASE: "{}", "team/x": "1"}}}
    assert residue_patch(raw) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "remove", "path": "/metadata/annotations/arbiter.dev~1last-handled-configuration"},
    ]
    assert residue_patch({"metadata": {"annotations": {"team/x": "1"}}}) is None


def test_a_stale_diff_base_is_removed_and_nothing_else(control_plane, namespace, api, operator_process):
    body = example()
    body["metadata"]["annotations"] = {DIFF_BASE: json.dumps({"spec": body["spec"]}), "team.example.com/note": "x"}
    create_dm(api, namespace, body)
    operator_process(namespaces=[namespace])

    def cleaned():
        dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, "credit-limit")
        return dm if DIFF_BASE not in dm["metadata"].get("annotations", {}) else None

    dm = eventually(cleaned, 60, "the diff base removed")
    assert dm["metadata"]["annotations"] == {"team.example.com/note": "x"}
