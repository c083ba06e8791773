"""The ownership decision before every write, against hostile objects: only a controller ownerReference with this
DecisionModel's uid makes an object ours, and the conflict message names kinds, names and field managers only."""

from __future__ import annotations

from arbiter_operator.apply import describe_owner
from arbiter_operator.observe.children import owned_by
from hypothesis import given, settings
from hypothesis import strategies as st
from support.factory import make_dm

UID = "0000-uid"
uids = st.sampled_from([UID, "other-uid", "", None])
refs = st.lists(st.fixed_dictionaries({
    "apiVersion": st.sampled_from(["arbiter.dev/v1alpha1", "v1"]),
    "kind": st.sampled_from(["DecisionModel", "ConfigMap", "Deployment"]),
    "name": st.sampled_from(["credit-limit", "other", ""]),
    "uid": uids,
}, optional={"controller": st.one_of(st.none(), st.booleans())}), max_size=4)


@settings(max_examples=500, deadline=None)
@given(refs, st.text(alphabet="abcdef0123456789", min_size=8, max_size=16))
def test_ours_only_through_a_controller_reference_with_our_uid(owner_refs, token) -> None:
    secret = f"s3cr3t-{token}"
    obj = {"metadata": {"name": "x", "ownerReferences": owner_refs, "annotations": {"note": secret},
                        "managedFields": [{"manager": "kubectl-client-side-apply"}]},
           "data": {"password": secret}}
    controller = next((r for r in owner_refs if r.get("controller")), None)
    assert owned_by(obj, UID) == (controller is not None and controller.get("uid") == UID)
    if not owned_by(obj, UID):
        assert secret not in describe_owner(obj, make_dm())  # only who holds it, nothing of its content


def test_an_object_without_owner_names_its_writers() -> None:
    obj = {"metadata": {"name": "credit-limit", "managedFields": [{"manager": "kubectl-create"}]}}
    assert describe_owner(obj, make_dm()) == "not controlled by any owner (written by kubectl-create)"
    assert not owned_by(obj, UID) and not owned_by(obj, "")
