"""The operator never shares or steals an object, on the real apiserver: a team's hand-made Route or another
DecisionModel's runtime under a name we would use is reported (ChildConflict) and left exactly as it was, and
generated pairs of DecisionModels in one namespace each get their own children."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from typing import Any

from arbiter_operator.api.models import isvc_name
from arbiter_operator.kube.client import KubeError
from arbiter_operator.render.naming import derived_names
from hypothesis import HealthCheck, given, settings
from hypothesis import example as hexample
from hypothesis import strategies as st
from kubernetes import client
from support.kubekit import raw_call
from support.operator_kit import condition, create_dm, eventually, example, get

ROUTES = ("route.openshift.io", "v1", "routes")
RUNTIMES = ("serving.kserve.io", "v1alpha1", "servingruntimes")


def _dm(api, ns, name="credit-limit"):
    return get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, name)


def _stalled_by_conflict(api, ns, name="credit-limit"):
    dm = _dm(api, ns, name)
    ready, stalled = condition(dm, "Ready"), condition(dm, "Stalled")
    return dm if ready and ready["reason"] == "ChildConflict" and stalled["status"] == "True" else None


def _ready(api, ns, name):
    dm = _dm(api, ns, name)
    c = condition(dm, "Ready") if dm else None
    return dm if c and c["status"] == "True" else None


def test_a_hand_made_route_is_reported_and_never_taken_over(
    control_plane, namespace, api, operator_process, predictors
):
    custom = client.CustomObjectsApi(api)
    theirs = {
        "apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": "credit-limit"},
        "spec": {"to": {"kind": "Service", "name": "team-frontend", "weight": 100}},
    }
    # Created the way `kubectl create` would, with its own field manager.
    custom.create_namespaced_custom_object(*ROUTES[:2], namespace, ROUTES[2], theirs, field_manager="kubectl-create")
    before = get(api, "route.openshift.io/v1", "routes", namespace, "credit-limit")

    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    dm = eventually(lambda: _stalled_by_conflict(api, namespace), 90, "ChildConflict")
    msg = condition(dm, "Ready")["message"]
    assert f"Route {namespace}/credit-limit already exists" in msg and "kubectl-create" in msg
    # Everything else is reconciled: the version serves behind its own InferenceService.
    eventually(lambda: get(api, "serving.kserve.io/v1beta1", "inferenceservices", namespace,
                           isvc_name("credit-limit", "1.0.0")), 60, "the InferenceService")

    after = get(api, "route.openshift.io/v1", "routes", namespace, "credit-limit")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # not written at all
    assert not after["metadata"].get("ownerReferences")  # so deleting the DecisionModel can never delete it
    def conflict_events() -> set[str]:  # posted right after the status write that the wait above saw
        events = client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="involvedObject.name=credit-limit")
        return {e.reason for e in events.items} & {"ChildConflict"}

    eventually(conflict_events, 30, "a ChildConflict event")


def test_another_decision_models_runtime_is_not_touched(control_plane, namespace, api, operator_process):
    """A ServingRuntime under our name whose controller is another DecisionModel (no storage needed: the runtime is
    rendered before any version deploys)."""
    custom = client.CustomObjectsApi(api)
    other = create_dm(api, namespace, {**example(), "metadata": {"name": "other"}})
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
        "metadata": {"name": "credit-limit-runtime", "ownerReferences": [{
            "apiVersion": "arbiter.dev/v1alpha1", "kind": "DecisionModel", "name": "other",
            "uid": other["metadata"]["uid"], "controller": True}]},
        "spec": {"containers": [{"name": "kserve-container", "image": "example.com/theirs:1"}],
                 "supportedModelFormats": [{"name": "vLLM"}]},
    }
    custom.create_namespaced_custom_object(*RUNTIMES[:2], namespace, RUNTIMES[2], runtime)
    before = get(api, "serving.kserve.io/v1alpha1", "servingruntimes", namespace, "credit-limit-runtime")

    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    dm = eventually(lambda: _stalled_by_conflict(api, namespace), 60, "ChildConflict")
    assert "ServingRuntime" in condition(dm, "Ready")["message"]
    assert "controlled by DecisionModel other" in condition(dm, "Ready")["message"]
    after = get(api, "serving.kserve.io/v1alpha1", "servingruntimes", namespace, "credit-limit-runtime")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert [r["name"] for r in after["metadata"]["ownerReferences"]] == ["other"]


# ---- generated pairs on the real apiserver ---------------------------------------------------------------------

segment = st.text(alphabet="a1", min_size=1, max_size=2)
dm_names = st.lists(segment, min_size=1, max_size=3).map(lambda parts: "a" + "-".join(parts))
version_names = st.lists(segment, min_size=1, max_size=3).map(lambda parts: "-".join(parts))
PAIRS = 4  # generated pairs, plus the explicit one below; each gets its own namespace


def _body(name: str, version: str) -> dict[str, Any]:
    body = copy.deepcopy(example())
    body["metadata"] = {"name": name}
    body["spec"]["versions"][0]["name"] = version  # same weights on storage: the version name is only a name
    body["spec"]["promote"]["version"] = version
    return body


def test_generated_pairs_in_one_namespace_get_separate_children(
    control_plane, namespace, api, operator_process, predictors
):
    """Each generated pair gets its own name prefix (`p<k>`), shared by both models of the pair, so leftovers of one
    pair never meet the next while the near-collisions inside a pair stay as generated."""
    monitoring = _monitoring_served(api)
    operator_process(namespaces=[namespace])
    custom = client.CustomObjectsApi(api)
    count = iter(range(100))

    @settings(max_examples=PAIRS, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @hexample(("a", "1-0"), ("a-1", "0"))  # the pair that once rendered one InferenceService name for both
    @given(st.tuples(dm_names, version_names), st.tuples(dm_names, version_names))
    def pair(a: tuple[str, str], b: tuple[str, str]) -> None:
        if a[0] == b[0]:
            return
        prefix = f"p{next(count)}"
        a, b = (prefix + a[0], a[1]), (prefix + b[0], b[1])
        for name, version in (a, b):
            create_dm(api, namespace, _body(name, version))
        for name, version in (a, b):
            dm = eventually(lambda name=name: _ready(api, namespace, name), 90, f"{name} Ready")
            uid = dm["metadata"]["uid"]
            for kind, child in derived_names(name, [version]):
                if kind == "Deployment" or (kind in MONITORING_KINDS and not monitoring):
                    continue  # Deployments are KServe's business; the monitoring kinds are made only where served
                obj = _get_kind(api, namespace, kind, child)
                if obj is None and kind in ASKED_FOR:
                    continue  # made only when the spec asks (spec.access, its network, a shadow phase)
                assert obj is not None, (kind, child)
                if kind != "Service":  # KServe's Services are owned by the InferenceService
                    refs = obj["metadata"]["ownerReferences"]
                    assert [r["uid"] for r in refs if r.get("controller")] == [uid], (kind, child, refs)
            route = custom.get_namespaced_custom_object(*ROUTES[:2], namespace, ROUTES[2], name)
            assert route["spec"]["to"]["name"] == f"{isvc_name(name, version)}-predictor"
            assert condition(dm, "Stalled")["status"] == "False"

    pair()


MONITORING_KINDS = {"PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
# Children a DecisionModel has only when its spec asks for them: where one exists, it is owned like the others.
ASKED_FOR = {"Role": ("rbac.authorization.k8s.io/v1", "roles"),
             "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
             "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies")}


def _monitoring_served(api) -> bool:
    """Whether this cluster serves prometheus-operator's API (the operator renders its kinds only then)."""
    try:
        found = raw_call(api, "GET", "/apis/monitoring.coreos.com/v1")
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    served = {r.get("name") for r in found.get("resources", [])}
    return set(MONITORING_KINDS.values()) <= served


def _get_kind(api, ns, kind, name):
    paths = {
        "ServingRuntime": ("serving.kserve.io/v1alpha1", "servingruntimes"),
        "InferenceService": ("serving.kserve.io/v1beta1", "inferenceservices"),
        "Route": ("route.openshift.io/v1", "routes"),
        "ConfigMap": ("v1", "configmaps"),
        "Service": ("v1", "services"),
        **{k: ("monitoring.coreos.com/v1", plural) for k, plural in MONITORING_KINDS.items()},
        **ASKED_FOR,
    }
    api_version, plural = paths[kind]
    return get(api, api_version, plural, ns, name)


def test_crd_name_rules_match_the_naming_predicate(control_plane, namespace, api):
    """Generated names: the apiserver accepts exactly what the pure tests assume it does (server-side dry run)."""
    # the predicate the pure property tests (tests/unit/operator) filter with
    from support.naming_rules import crd_accepts

    names = st.text(alphabet="ab1-.", min_size=1, max_size=50)
    versions = st.text(alphabet="1.-a", min_size=1, max_size=12)

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(names, versions)
    def check(name: str, version: str) -> None:
        body = _body(name, version)
        try:
            raw_call(api, "POST", f"/apis/arbiter.dev/v1alpha1/namespaces/{namespace}/decisionmodels",
                     body=body, query=[("dryRun", "All")])
            accepted = True
        except Exception as exc:  # KubeError 422 (the CRD refused it) or 400 (an invalid object name)
            assert getattr(exc, "status", None) in (400, 422), exc
            accepted = False
        assert accepted == crd_accepts(name, [version]), (name, version, json.dumps(accepted))

    check()


_FOREIGN_KINDS = {  # (apiVersion, kind) -> a minimal valid body of that kind, as somebody else would write it
    ("v1", "ConfigMap"): {"data": {"team": "theirs"}},
    ("v1", "Service"): {"spec": {"ports": [{"port": 8080}]}},
    ("route.openshift.io/v1", "Route"): {"spec": {"to": {"kind": "Service", "name": "team-frontend", "weight": 100}}},
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): {"spec": {
        "containers": [{"name": "kserve-container", "image": "example.com/theirs:1"}],
        "supportedModelFormats": [{"name": "vLLM"}]}},
}
_label_values = st.text(alphabet="abc-1", min_size=1, max_size=5).filter(lambda s: s[0].isalnum() and s[-1].isalnum())


async def _once(kube, call):
    """One awaited call of the operator's client on a loop of its own (asyncio.run), its transport closed after."""
    try:
        return await call
    finally:
        await kube.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(_FOREIGN_KINDS)), labels=st.dictionaries(
    st.sampled_from(["app", "arbiter.dev/decisionmodel", "team"]), _label_values, max_size=3),
    manager=st.sampled_from(["kubectl-create", "arbiter-operator", "helm"]), same_fields=st.booleans())
def test_a_create_never_touches_an_object_already_under_the_name(control_plane, namespace, api, kind, labels,
                                                                 manager, same_fields):
    """Whoever made the object under the name (another team, a copy of our label, even our own field manager) and
    whatever it holds (our very fields, or conflicting ones), the operator's create is refused and the object stays
    byte for byte as it was; a free name is created by server-side apply, so later applies own their fields."""
    from arbiter_operator.kube.client import KubeError, RestKubeClient

    kc = RestKubeClient(api)
    api_version, kind_name = kind
    name = f"n-{uuid.uuid4().hex[:8]}"
    ours = {"apiVersion": api_version, "kind": kind_name, "metadata": {
        "name": name, "namespace": namespace, "labels": {"arbiter.dev/decisionmodel": "credit-limit"}},
        **copy.deepcopy(_FOREIGN_KINDS[kind])}
    theirs = copy.deepcopy(ours) if same_fields else {
        "apiVersion": api_version, "kind": kind_name, "metadata": {"name": name, "namespace": namespace},
        **copy.deepcopy(_FOREIGN_KINDS[kind])}
    theirs["metadata"]["labels"] = labels
    if not same_fields and kind_name == "ConfigMap":
        theirs["data"] = {"team": "other"}
    plural = {"ConfigMap": "configmaps", "Service": "services", "Route": "routes", "ServingRuntime": "servingruntimes"}
    path = f"/api/v1/namespaces/{namespace}/{plural[kind_name]}" if api_version == "v1" else \
        f"/apis/{api_version}/namespaces/{namespace}/{plural[kind_name]}"
    raw_call(api, "POST", path, theirs, [("fieldManager", manager)])
    before = get(api, api_version, plural[kind_name], namespace, name)

    try:
        asyncio.run(_once(kc, kc.acreate(ours)))
        raise AssertionError("a create over an existing object succeeded")
    except KubeError as exc:
        assert exc.status == 409
    assert get(api, api_version, plural[kind_name], namespace, name) == before

    free = {**copy.deepcopy(ours), "metadata": {**ours["metadata"], "name": name + "-free"}}
    asyncio.run(_once(kc, kc.acreate(free)))
    # Read back whole: the operator's client decodes the answers to its writes without managedFields.
    created = get(api, api_version, plural[kind_name], namespace, name + "-free")
    assert [m["operation"] for m in created["metadata"]["managedFields"]] == ["Apply"]
    # Our later apply stops sending the label: server-side apply removes it (we own it as an applier).
    free["metadata"]["labels"] = {}
    applied = asyncio.run(_once(kc, kc.aapply(free)))
    assert "labels" not in applied["metadata"] or not applied["metadata"]["labels"]
