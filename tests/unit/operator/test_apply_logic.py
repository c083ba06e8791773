"""The no-write rules of apply.py, on plain data."""

from __future__ import annotations

from arbiter_operator.apply import ANN_APPLIED_HASH, contains, merge_patch, needs_apply, with_hash


def test_live_object_with_server_defaults_needs_no_apply():
    desired = with_hash({"kind": "Route", "metadata": {"name": "r"}, "spec": {"to": {"name": "a", "weight": 100}}})
    live = {"kind": "Route", "metadata": {"name": "r", "uid": "1", "resourceVersion": "7",
                                           "annotations": dict(desired["metadata"]["annotations"])},
            "spec": {"to": {"kind": "Service", "name": "a", "weight": 100}, "wildcardPolicy": "None"}}
    assert not needs_apply(desired, live)


def test_edited_deleted_or_changed_children_are_applied():
    desired = with_hash({"kind": "Route", "metadata": {"name": "r"}, "spec": {"to": {"name": "a", "weight": 100}}})
    live = {"kind": "Route", "metadata": {"name": "r", "annotations": dict(desired["metadata"]["annotations"])},
            "spec": {"to": {"name": "a", "weight": 100}}}
    assert needs_apply(desired, None)
    edited = {**live, "spec": {"to": {"name": "elsewhere", "weight": 100}}}
    assert needs_apply(desired, edited)
    # A field we stopped setting (alternateBackends) is only removed by re-applying: the hash tells.
    stale = {**live, "metadata": {"name": "r", "annotations": {ANN_APPLIED_HASH: "0000"}},
             "spec": {"to": {"name": "a", "weight": 100}, "alternateBackends": [{"name": "b", "weight": 10}]}}
    assert needs_apply(desired, stale)


def test_lists_must_match_item_by_item():
    assert contains({"a": [{"x": 1, "y": 2}]}, {"a": [{"x": 1}]})
    assert not contains({"a": [{"x": 1}, {"x": 2}]}, {"a": [{"x": 1}]})


def test_merge_patch():
    assert merge_patch({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}) is None
    assert merge_patch({"a": 1, "url": "x"}, {"a": 2}) == {"a": 2, "url": None}
    assert merge_patch({"b": {"c": 2, "d": 3}}, {"b": {"c": 2}}) == {"b": {"d": None}}
    assert merge_patch({"l": [1, 2]}, {"l": [1]}) == {"l": [1]}


def test_the_hash_stamp_keeps_the_manifest_and_its_annotations_and_changes_nothing_of_it():
    """The stamp is the hash of the manifest as planned (the same as every earlier release wrote, so an upgrade
    re-applies nothing), beside the annotations the plan set; the planned manifest itself stays as it was."""
    from arbiter_operator.render.common import checksum

    desired = {"kind": "Route", "metadata": {"name": "r", "annotations": {"team": "risk"}},
               "spec": {"to": {"name": "a", "weight": 100}}}
    before = checksum(desired)
    stamped = with_hash(desired)
    assert stamped["metadata"]["annotations"] == {"team": "risk", ANN_APPLIED_HASH: before[:16]}
    assert stamped["spec"] == desired["spec"] and stamped["metadata"]["name"] == "r"
    assert checksum(desired) == before and ANN_APPLIED_HASH not in desired["metadata"]["annotations"]
    bare = with_hash({"kind": "Route", "metadata": {"name": "r"}, "spec": {}})
    assert list(bare["metadata"]["annotations"]) == [ANN_APPLIED_HASH]


def test_kserves_rewrite_of_the_deployment_mode_name_does_not_make_a_converged_inferenceservice_apply_again():
    def isvc(mode: str) -> dict:
        return {"kind": "InferenceService", "metadata": {"name": "m--1-0-0", "annotations": {
            "serving.kserve.io/deploymentMode": mode}}, "spec": {"predictor": {"minReplicas": 1}}}

    first = with_hash(isvc("RawDeployment"))  # a first write, before the operator knows KServe's name
    live = {**first, "metadata": {**first["metadata"], "annotations": {  # KServe 0.16+ rewrote it
        **first["metadata"]["annotations"], "serving.kserve.io/deploymentMode": "Standard"}}}
    assert not needs_apply(with_hash(isvc("Standard")), live)  # the next pass renders KServe's name: no write
    assert needs_apply(with_hash({**isvc("Standard"), "spec": {"predictor": {"minReplicas": 2}}}), live)
    route = {"kind": "Route", "metadata": {"name": "r", "annotations": {"serving.kserve.io/deploymentMode": "x"}}}
    assert with_hash(route)["metadata"]["annotations"][ANN_APPLIED_HASH] != with_hash(
        {**route, "metadata": {"name": "r"}})["metadata"]["annotations"][ANN_APPLIED_HASH]
