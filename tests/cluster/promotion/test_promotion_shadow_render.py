"""The shadow phase as the planner renders it: the stable version's ConfigMap carries shadow.json (the candidate's
in-cluster URL and the sampling settings) only while the shadow phase runs, and switching it on or off never changes
the stable pods' template (no restart of the version that serves)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from arbiter_operator.api.models import DecisionModel, isvc_name
from arbiter_operator.api.promotion import AnalysisRun
from arbiter_operator.plan import Observations, children_of, plan
from arbiter_operator.promotion import analysis_due, judge
from arbiter_operator.render.common import ANN_CONFIG_CHECKSUM
from arbiter_operator.render.shadow_rbac import render_shadow_rbac
from kubernetes import client
from support.plannerdrive import Driver, same_mix, two_versions


def children(d: Driver) -> dict[tuple[str, str], dict]:
    p = plan(d.dm(), Observations(children=children_of(InferenceService=d.isvcs)), d.now)
    return {(c["kind"], c["metadata"]["name"]): c for c in p.children or []}


def pod_checksum(kids: dict, version: str) -> str:
    isvc = kids[("InferenceService", isvc_name("credit-limit", version))]
    return isvc["spec"]["predictor"]["annotations"][ANN_CONFIG_CHECKSUM]


def shadow_run(d: Driver, agree: float, disagree: float) -> AnalysisRun | None:
    dm = d.dm()
    q = analysis_due(dm.spec.promote, dm.status.promotion, d.now, namespace="team", model=dm.metadata.name,
                     sla_p95_ms=150)
    if q is None:
        return None
    return judge(q, {"requests": 500, "errors": 0, "decision_p95": 0.05,
                     "shadow_agree": {"true": agree, "false": disagree}, **same_mix(500)})


def test_shadow_json_lives_in_the_stable_configmap_only_during_the_shadow_phase():
    d = Driver(two_versions("1.0.0", strategy="Shadow", shadow={"holdSeconds": 60, "sampleRate": 0.25,
                                                                "minCompared": 10}))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    before = children(d)
    stable_cm = ("ConfigMap", isvc_name("credit-limit", "1.0.0") + "-decision")
    assert "shadow.json" not in before[stable_cm]["data"]
    checksum_before = pod_checksum(before, "1.0.0")

    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.set_ready("1.1.0")
    s = d.reconcile(1)
    assert s["status"]["promotion"]["phase"] == "Shadowing"
    kids = children(d)
    shadow = json.loads(kids[stable_cm]["data"]["shadow.json"])
    url = f"http://{isvc_name('credit-limit', '1.1.0')}-predictor.team.svc.cluster.local"
    assert shadow == {"candidate": "1.1.0", "url": url,
                      "sampleRate": 0.25, "timeoutMs": 2000, "maxInFlight": 16}
    cand_cm = ("ConfigMap", isvc_name("credit-limit", "1.1.0") + "-decision")
    assert "shadow.json" not in kids[cand_cm]["data"]
    assert pod_checksum(kids, "1.0.0") == checksum_before  # mirroring on: stable pods untouched
    route = next(c for k, c in kids.items() if k[0] == "Route")
    assert isvc_name("credit-limit", "1.1.0") not in json.dumps(route["spec"])  # no live traffic to the candidate

    d.now += timedelta(seconds=60)
    s = d.reconcile(0, shadow_run(d, 100, 0))
    assert s["status"]["promotion"]["phase"] == "Cooling"
    kids = children(d)
    assert "shadow.json" not in kids[stable_cm]["data"]  # removed at the end (server-side apply drops the key)
    assert pod_checksum(kids, "1.0.0") == checksum_before


def test_with_auth_on_the_stable_pods_may_call_the_candidate_only_during_the_shadow_phase():
    d = Driver(two_versions("1.0.0", strategy="Shadow", shadow={"holdSeconds": 60, "minCompared": 10}))
    assert d.dm().spec.exposure.auth  # the example's default
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    assert not [k for k in children(d) if k[0] in ("Role", "RoleBinding")]
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.set_ready("1.1.0")
    d.reconcile(1)
    kids = children(d)
    role, binding = kids[("Role", "credit-limit-shadow")], kids[("RoleBinding", "credit-limit-shadow")]
    assert role["rules"] == [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
                              "resourceNames": [isvc_name("credit-limit", "1.1.0")], "verbs": ["get"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "default", "namespace": "team"}]
    assert role["metadata"]["ownerReferences"][0]["uid"] == "uid-1"

    # Shadow phase over: the grant goes (the planner deletes what it observes of it).
    d.now += timedelta(seconds=60)
    d.reconcile(0, shadow_run(d, 100, 0))
    obs = Observations(children=children_of(InferenceService=d.isvcs, Role={"credit-limit-shadow": role},
                                            RoleBinding={"credit-limit-shadow": binding}))
    p = plan(d.dm(), obs, d.now)
    assert not [c for c in p.children if c["kind"] in ("Role", "RoleBinding")]
    assert ("rbac.authorization.k8s.io/v1", "Role", "credit-limit-shadow") in p.deletions
    assert ("rbac.authorization.k8s.io/v1", "RoleBinding", "credit-limit-shadow") in p.deletions


@pytest.mark.cluster
def test_the_rendered_grant_lets_exactly_the_stable_pods_get_the_candidate(control_plane, namespace):
    """On the real apiserver: the SubjectAccessReview the candidate's runtime makes for the stable pods' token is
    allowed by the rendered Role, and nothing wider is."""
    body = two_versions("1.0.0", strategy="Shadow")
    body["metadata"]["namespace"] = namespace
    dm = DecisionModel.model_validate(body)
    api = control_plane.api_client()
    try:
        rbac = client.RbacAuthorizationV1Api(api)
        role, binding = render_shadow_rbac(dm, "1.1.0")
        for obj in (role, binding):
            obj["metadata"].pop("ownerReferences")  # no DecisionModel object here to own them
        rbac.create_namespaced_role(namespace, role)
        rbac.create_namespaced_role_binding(namespace, binding)
        auth = client.AuthorizationV1Api(api)

        def allowed(user: str, name: str, verb: str = "get") -> bool:
            review = auth.create_subject_access_review({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                         "resourceAttributes": {"namespace": namespace, "group": "serving.kserve.io",
                                                "resource": "inferenceservices", "name": name, "verb": verb}}})
            return bool(review.status.allowed)

        stable_pods = f"system:serviceaccount:{namespace}:default"
        assert allowed(stable_pods, isvc_name("credit-limit", "1.1.0"))
        assert not allowed(stable_pods, isvc_name("credit-limit", "1.0.0"))  # only the candidate
        assert not allowed(stable_pods, isvc_name("credit-limit", "1.1.0"), verb="delete")
        assert not allowed(f"system:serviceaccount:{namespace}:other", isvc_name("credit-limit", "1.1.0"))
    finally:
        api.close()
