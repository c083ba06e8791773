"""spec.access as RBAC, through the real planner: one Role granting `get` on exactly the InferenceServices live in a
pass, bound to exactly the callers listed, across a promotion; nothing without spec.access or a live version (an
empty resourceNames would grant every InferenceService of the namespace)."""

from __future__ import annotations

import copy

import pytest
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.render.access_rbac import render_access_rbac
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.plannerdrive import Driver, two_versions

ACCESS = {"users": ["alice@example.com"], "groups": ["finance"],
          "serviceAccounts": [{"name": "pricing-app"}, {"name": "batch", "namespace": "jobs"}]}


def _grants(d: Driver) -> tuple[list[str] | None, list[tuple[str, str, str | None]] | None]:
    """(resourceNames of the callers' Role, its RoleBinding's subjects) as the last plan applies them."""
    by_kind = {(c["kind"], c["metadata"]["name"]): c for c in d.last.children or []}
    role, binding = by_kind.get(("Role", "credit-limit-callers")), by_kind.get(("RoleBinding", "credit-limit-callers"))
    names = role["rules"][0]["resourceNames"] if role else None
    subjects = [(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"]] if binding else None
    return names, subjects


def _body(**access) -> dict:
    body = two_versions("1.0.0", rollbackWindowSeconds=60)
    body["spec"]["access"] = copy.deepcopy(access or ACCESS)
    return body


def test_callers_may_get_every_live_version_through_a_promotion():
    d = Driver(_body())
    d.reconcile()
    names, subjects = _grants(d)
    assert names == ["credit-limit--1-0-0"]  # from the pass that creates the first InferenceService
    assert subjects == [("Group", "finance", None), ("ServiceAccount", "batch", "jobs"),
                        ("ServiceAccount", "pricing-app", "team"), ("User", "alice@example.com", None)]
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.edit_spec(version="1.1.0")
    d.reconcile(1)  # the candidate's InferenceService is applied in this pass: its name is granted in the same one
    assert _grants(d)[0] == ["credit-limit--1-0-0", "credit-limit--1-1-0"]
    d.set_ready("1.1.0")
    d.reconcile(1)  # promoted; 1.0.0 stays warm for the rollback window: still callable
    assert d.snapshot["status"]["promotion"]["stable"] == "1.1.0"
    assert _grants(d)[0] == ["credit-limit--1-0-0", "credit-limit--1-1-0"]
    d.reconcile(61)  # the window is over: 1.0.0 is deleted in the pass that drops its name
    assert _grants(d)[0] == ["credit-limit--1-1-0"]
    assert ("rbac.authorization.k8s.io/v1", "Role", "credit-limit-callers") not in d.last.deletions


def test_without_access_nothing_is_granted_and_a_removed_access_is_deleted():
    d = Driver(two_versions("1.0.0"))
    d.reconcile()
    assert _grants(d) == (None, None)
    d = Driver(_body())
    d.reconcile()
    del d.body["spec"]["access"]
    d.body["metadata"]["generation"] += 1
    role = next(c for c in d.last.children if c["kind"] == "Role")
    binding = next(c for c in d.last.children if c["kind"] == "RoleBinding")
    d.observations = lambda analysis, base=d.observations: _with_children(base(analysis), role, binding)
    d.reconcile(1)
    assert _grants(d) == (None, None)
    assert {(k, n) for _, k, n in d.last.deletions} >= {("Role", "credit-limit-callers"),
                                                        ("RoleBinding", "credit-limit-callers")}


def _with_children(obs, *objs):
    import dataclasses

    children = dict(obs.children)
    children.update({(o["kind"], o["metadata"]["name"]): o for o in objs})
    return dataclasses.replace(obs, children=children)


def test_all_authenticated_is_said_explicitly():
    dm = DecisionModel.model_validate(_body(allAuthenticated=True))
    (_, binding) = render_access_rbac(dm, ["1.0.0"])
    assert binding["subjects"] == [{"kind": "Group", "name": "system:authenticated",
                                    "apiGroup": "rbac.authorization.k8s.io"}]


@pytest.mark.parametrize("access", [{"serviceAccounts": [{"name": "Bad_Name"}]},
                                    {"serviceAccounts": [{"name": "ok", "namespace": "no.dots"}]},
                                    {"users": [""]}, {"groups": ["x" * 254]}])
def test_malformed_callers_are_refused(access):
    with pytest.raises(ValidationError):
        DecisionModel.model_validate(_body(**access))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["1.0.0", "1.1.0"]), max_size=3), st.booleans(), st.booleans())
def test_never_a_role_without_resource_names_nor_a_binding_without_subjects(versions, with_users, everyone):
    access = {"users": ["alice"] if with_users else [], "allAuthenticated": everyone}
    dm = DecisionModel.model_validate(_body(**access))
    out = render_access_rbac(dm, versions)
    if not versions or not (with_users or everyone):
        assert out == []
        return
    role, binding = out
    assert role["rules"] == [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
                              "resourceNames": sorted({f"credit-limit--{v.replace('.', '-')}" for v in versions}),
                              "verbs": ["get"]}]
    assert binding["subjects"] and binding["roleRef"]["name"] == role["metadata"]["name"]
