"""Least privilege, proven by the real RBAC authorizer.

A kube-apiserver of our own (RBAC on, audit log on) gets the chart's ServiceAccount and RBAC exactly as `helm template`
renders them. The operator runs authenticated as that ServiceAccount (a TokenRequest token) through the reconcile and
promotion scenarios (an Immediate promotion, and a canary whose analysis fails and rolls back), with the KServe
stand-in playing KServe's controller, a Prometheus stand-in answering empty vectors, and real S3 (SeaweedFS) holding the
weights; its metrics endpoint (auth on, as the chart runs it) is scraped without a token, with a token of no grant
and with one bound to the chart's metrics-reader ClusterRole, so the operator makes its TokenReviews and
SubjectAccessReviews. The metrics-reader ClusterRole itself is judged by the authorizer: `get /metrics`, nothing else.
The audit log then says which requests the authorizer allowed and which it forbade:
- nothing the operator did was forbidden;
- every (group, resource, verb) the chart grants was used, except the grants listed in NOT_EXERCISABLE with the reason
  a plain kube-apiserver cannot exercise them.
"""

from __future__ import annotations

import copy
import http.server
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv.cluster import wait_default_service_account
from arbiter_devenv.operator_process import OperatorProcess
from kubernetes import client
from support.http_stub import serving
from support.identities import bind_to_metrics_reader, service_account_token
from support.kubekit import raw_call
from support.operator_kit import condition, create_dm, eventually, example, get, seed_model_storage
from support.rbackit import (
    Identity,
    audited_control_plane,
    describe,
    expand,
    forbidden,
    install_chart_identity,
    read_audit,
    unused_grants,
    used_grants,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"

# Grants no request on a plain kube-apiserver can use (or none these scenarios can be sure to make), and why they
# are still needed.
NOT_EXERCISABLE = {
    # OpenShift's Route admission asks the authorizer whether the *requester* may `create routes/custom-host` before
    # it accepts a Route with spec.host; no API call is made by the operator for it. The scenario below checks that
    # the operator does send spec.host (spec.exposure.host), i.e. that OpenShift would make that check.
    ("route.openshift.io", "routes/custom-host", "create"),
    # A reason repeated on one DecisionModel is written into its earlier Event (count, message) at most once a
    # minute (kube/client.py, SERIES_WRITE_INTERVAL); these scenarios finish before any series is due a second
    # write. tests/cluster/operator/test_operator_events.py makes that PATCH on the real apiserver.
    ("", "events", "patch"),
    # A namespace is read by name only by a reconcile that runs before its label watch (kube/namespaces.py) has
    # answered, which fills the watch cache; whether the first reconcile or the watch's list comes first is a race
    # these scenarios do not control. The grant is still needed for the reconcile that wins it.
    ("", "namespaces", "get"),
    # Thanos Querier's tenancy port (kube-rbac-proxy) asks the authorizer whether the operator's token may `get
    # pods.metrics.k8s.io` in the namespace a promotion analysis queries; the operator itself makes no such request.
    # test_the_tenancy_ports_check_passes_where_the_operator_serves_and_nowhere_else asks the authorizer that question.
    ("metrics.k8s.io", "pods", "get"),
}


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, pathlib.Path]]:
    with audited_control_plane(tmp_path_factory.mktemp("audited-cp")) as (cp, log):
        yield cp, log


@pytest.fixture
def admin(audited) -> Iterator[client.ApiClient]:
    api = audited[0].api_client()
    try:
        yield api
    finally:
        api.close()


def _namespace(api: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_default_service_account(api, name)
    return name


def _patch_dm(api: client.ApiClient, ns: str, name: str, patch: dict) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, ns, P, name, patch)


def _ready(api: client.ApiClient, ns: str, name: str, timeout: float = 90.0) -> dict:
    def check():
        dm = get(api, f"{G}/{V}", P, ns, name)
        c = condition(dm or {}, "Ready")
        gen = (dm or {}).get("metadata", {}).get("generation")
        return dm if c and c["status"] == "True" and c.get("observedGeneration") == gen else None

    return eventually(check, timeout, f"{ns}/{name} Ready")


def _two_versions(body: dict) -> dict:
    body = copy.deepcopy(body)
    v2 = copy.deepcopy(body["spec"]["versions"][0])
    v2["name"] = "1.1.0"
    v2["storageUri"] = "s3://models/credit-limit/1.1.0"
    body["spec"]["versions"].append(v2)
    return body


def _relabelled(api: client.ApiClient, ns: str, group: str, version: str, plural: str, selector: str) -> None:
    """Remove the operator's label from its objects of one kind (found by `selector`) and wait until it is back."""
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    key = selector.split("=", 1)[0]

    def ours() -> list[str]:  # KServe copies an InferenceService's labels onto what it creates: not ours to test
        items = raw_call(api, "GET", f"{prefix}/namespaces/{ns}/{plural}", query=[("labelSelector", selector)])
        return sorted(o["metadata"]["name"] for o in items["items"]
                      if any(r.get("kind") == "DecisionModel" for r in o["metadata"].get("ownerReferences") or []))

    found = ours()
    assert found, f"no {plural} of the operator's labelled {selector}"
    for name in found:
        raw_call(api, "PATCH", f"{prefix}/namespaces/{ns}/{plural}/{name}",
                 body={"metadata": {"labels": {key: None}}}, content_type="application/merge-patch+json")
    eventually(lambda: ours() == found or None, 60, f"the label back on the {plural}")


def _run_scenarios(admin: client.ApiClient, ns: str, op_kubeconfig: pathlib.Path) -> OperatorProcess:
    """Reconcile and promotion scenarios, driven as a user would, with the operator as the chart's ServiceAccount."""
    core = client.CoreV1Api(admin)
    custom = client.CustomObjectsApi(admin)

    # 1. A DecisionModel to Ready (artifacts read from S3 with the storage-config Secret, children applied, Route).
    dm = _two_versions(example())
    dm["spec"]["promote"]["rollbackWindowSeconds"] = 0
    dm["spec"]["exposure"]["host"] = f"credit-limit.{ns}.apps.example.com"
    # Named callers (spec.access): the operator grants them `get` on the live versions' InferenceServices with a Role
    # and a RoleBinding it creates without `escalate` or `bind` (it holds that `get` itself).
    dm["spec"]["access"] = {"users": ["alice@example.com"], "groups": ["finance"], "allAuthenticated": False,
                            "serviceAccounts": [{"name": "pricing-app"}, {"name": "batch", "namespace": "jobs"}],
                            "network": {"from": [{"namespace": "finance"}]}}
    create_dm(admin, ns, dm)
    _ready(admin, ns, "credit-limit")
    callers = client.RbacAuthorizationV1Api(admin).read_namespaced_role_binding("credit-limit-callers", ns)
    assert {(s.kind, s.name) for s in callers.subjects} == {
        ("User", "alice@example.com"), ("Group", "finance"), ("ServiceAccount", "pricing-app"),
        ("ServiceAccount", "batch")}

    # The Route carries spec.host: on OpenShift this is what needs routes/custom-host (NOT_EXERCISABLE).
    route = get(admin, "route.openshift.io/v1", "routes", ns, "credit-limit")
    assert route and route["spec"].get("host") == f"credit-limit.{ns}.apps.example.com"

    # 2. Drift: a deleted child comes back.
    cms = core.list_namespaced_config_map(ns, label_selector="arbiter.dev/decision-model=credit-limit").items
    assert cms, "the operator created no decision ConfigMap"
    core.delete_namespaced_config_map(cms[0].metadata.name, ns)
    custom.delete_namespaced_custom_object("route.openshift.io", "v1", ns, "routes", "credit-limit")
    eventually(lambda: get(admin, "route.openshift.io/v1", "routes", ns, "credit-limit"), 60, "Route restored")
    eventually(lambda: core.list_namespaced_config_map(
        ns, label_selector="arbiter.dev/decision-model=credit-limit").items, 60, "ConfigMap restored")

    # 2b. Drift: a child whose label someone removed leaves the watch cache; the operator's create-only apply finds
    #     the name taken, reads the object by name (`get`), sees it is its own, and puts the label back.
    label = "arbiter.dev/decision-model"
    for group, version, plural in (("", "v1", "services"), ("route.openshift.io", "v1", "routes"),
                                   ("monitoring.coreos.com", "v1", "podmonitors"),
                                   ("monitoring.coreos.com", "v1", "prometheusrules"),
                                   ("serving.kserve.io", "v1alpha1", "servingruntimes"),
                                   ("serving.kserve.io", "v1beta1", "inferenceservices"),
                                   ("networking.k8s.io", "v1", "networkpolicies"),
                                   ("rbac.authorization.k8s.io", "v1", "roles"),
                                   ("rbac.authorization.k8s.io", "v1", "rolebindings")):
        _relabelled(admin, ns, group, version, plural, f"{label}=credit-limit")

    # 3. A changed decision setting updates the ConfigMap; spec.access.network removed deletes the NetworkPolicy.
    _patch_dm(admin, ns, "credit-limit", {"spec": {"decision": {"confidenceThreshold": 0.9},
                                                   "access": {"network": None}}})
    _ready(admin, ns, "credit-limit")
    eventually(lambda: not client.NetworkingV1Api(admin).list_namespaced_network_policy(ns).items, 60,
               "the NetworkPolicy deleted")

    # 4. Promotion (Immediate, no rollback window): the candidate gets an InferenceService, traffic moves, the previous
    #    version's InferenceService is deleted.
    _patch_dm(admin, ns, "credit-limit", {"spec": {"promote": {"version": "1.1.0"}}})

    def promoted():
        dm_now = get(admin, f"{G}/{V}", P, ns, "credit-limit")
        c = condition(dm_now or {}, "Promoted")
        isvcs = custom.list_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices")["items"]
        names = sorted(i["metadata"]["name"] for i in isvcs)
        return c and c["status"] == "True" and names == ["credit-limit--1-1-0"]

    eventually(promoted, 120, "1.1.0 promoted and 1.0.0 stopped")
    _ready(admin, ns, "credit-limit")
    role = client.RbacAuthorizationV1Api(admin).read_namespaced_role("credit-limit-callers", ns)
    assert role.rules[0].resource_names == ["credit-limit--1-1-0"]  # patched as the versions changed

    # 4b. A canary promotion back to 1.0.0 whose analysis finds no data (the Prometheus stand-in answers an empty
    #     vector) with insufficientTraffic: Fail: rolled back, candidate stopped, stable keeps serving.
    _patch_dm(admin, ns, "credit-limit", {"spec": {"promote": {
        "version": "1.0.0", "strategy": "Canary", "steps": [{"weight": 10, "holdSeconds": 0}],
        "analysis": {"intervalSeconds": 5, "minRequests": 1, "insufficientTraffic": "Fail"}}}})

    def rolled_back():
        dm_now = get(admin, f"{G}/{V}", P, ns, "credit-limit") or {}
        phase = ((dm_now.get("status") or {}).get("promotion") or {}).get("phase")
        isvcs = custom.list_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices")["items"]
        return phase == "Failed" and [i["metadata"]["name"] for i in isvcs] == ["credit-limit--1-1-0"]

    eventually(rolled_back, 120, "the canary to 1.0.0 rolled back")

    # 4c. A shadow promotion of 1.0.0 (auth on): while it shadows, the operator grants the stable pods `get` on the
    #     candidate's InferenceService (Role + RoleBinding, watched by label); no shadow data comes (empty vectors)
    #     with insufficientTraffic: Fail, so it rolls back and the grant is deleted.
    _patch_dm(admin, ns, "credit-limit", {"spec": {"promote": {
        "strategy": "Shadow", "shadow": {"holdSeconds": 40, "minCompared": 1}}}})
    rbac = client.RbacAuthorizationV1Api(admin)

    def shadow_grant():
        return [r.metadata.name for r in rbac.list_namespaced_role_binding(
            ns, label_selector="arbiter.dev/component=shadow-caller").items]

    eventually(lambda: shadow_grant() == ["credit-limit-shadow"] or None, 120, "the shadow grant created")
    for plural in ("roles", "rolebindings"):  # the grant's component label removed mid-phase: put back
        _relabelled(admin, ns, "rbac.authorization.k8s.io", "v1", plural, "arbiter.dev/component=shadow-caller")
    eventually(lambda: rolled_back() and not shadow_grant(), 120, "the shadow phase rolled back, its grant deleted")

    # 5. A DecisionModel that names a ModelRegistry and a registry token Secret (the registry itself need not answer:
    #    the reads happen before any call to it).
    client.CoreV1Api(admin).create_namespaced_secret(
        ns, {"metadata": {"name": "registry-token"}, "stringData": {"token": "not-a-real-token"}}
    )
    reg = _two_versions(example())
    reg["metadata"]["name"] = "with-registry"
    reg["spec"]["registry"] = {
        "modelRegistryRef": {"name": "missing-registry"},
        "tokenSecretRef": {"name": "registry-token"},
    }
    create_dm(admin, ns, reg)
    eventually(lambda: condition(get(admin, f"{G}/{V}", P, ns, "with-registry") or {}, "Registered"), 60,
               "a Registered condition")

    # 5b. CA bundles from ConfigMaps (spec.storage.caBundleConfigMapRef, spec.registry.caBundleConfigMapRef): read by
    #     name, so the chart must grant `get` on ConfigMaps, or the conditions would stay Unknown on a 403.
    with open(admin.configuration.ssl_ca_cert, encoding="utf-8") as fh:
        ca_pem = fh.read()
    core.create_namespaced_config_map(ns, {"metadata": {"name": "internal-ca"}, "data": {"ca.crt": ca_pem}})
    with_ca = example()
    with_ca["metadata"]["name"] = "with-ca"
    with_ca["spec"]["storage"] = {**(with_ca["spec"].get("storage") or {}),
                                  "caBundleConfigMapRef": {"name": "internal-ca"}}
    with_ca["spec"]["registry"] = {"url": "https://127.0.0.1:9", "tokenSecretRef": {"name": "registry-token"},
                                   "caBundleConfigMapRef": {"name": "internal-ca"}}
    create_dm(admin, ns, with_ca)

    def ca_read():
        dm_now = get(admin, f"{G}/{V}", P, ns, "with-ca") or {}
        reg, art = condition(dm_now, "Registered"), condition(dm_now, "ArtifactsValid")
        # Read and used: the registry is then merely unreachable, the artifacts checked through the bundle.
        text = (reg.get("message", "") + art.get("message", "")).lower() if reg and art else ""
        return reg and art and "configmap" not in text and "cannot read" not in text

    eventually(ca_read, 60, "both CA bundles read")

    # 6. Deleting DecisionModels: whatever the operator does on the way out (finalizers) must be allowed too.
    custom.delete_namespaced_custom_object(G, V, ns, P, "with-ca")
    custom.delete_namespaced_custom_object(G, V, ns, P, "with-registry")
    custom.delete_namespaced_custom_object(G, V, ns, P, "credit-limit")
    eventually(lambda: not custom.list_namespaced_custom_object(G, V, ns, P)["items"], 60, "DecisionModels gone")


class _EmptyPrometheus(http.server.BaseHTTPRequestHandler):
    """Prometheus stand-in: every instant query has an empty vector as its answer (Prometheus' wire format)."""

    def do_GET(self) -> None:
        data = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus_url() -> Iterator[str]:
    with serving(_EmptyPrometheus) as url:
        yield url


def _operator(identity: Identity, namespaces: list[str], tmp: pathlib.Path, prometheus: str = "",
              metrics: bool = False) -> OperatorProcess:
    env = {"ARBITER_PROMETHEUS_URL": prometheus} if prometheus else {}
    return OperatorProcess(
        identity.kubeconfig, namespaces, log_dir=tmp, env=env, metrics=metrics, metrics_auth=True,
        # As the chart runs it: with leader election on a Lease in the release namespace.
        extra_args=("--log-level=debug", "--leader-elect", "--leader-election-namespace", identity.namespace),
    ).start()


# The metrics filter's reviews: cluster-scoped, created and never stored (the chart's ClusterRole, metrics.auth).
REVIEWS = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
           {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
METRICS_READER = "arbiter-metrics-reader"  # the chart's ClusterRole for scrapers, applied by install_chart_identity


def _scrape_as_three_callers(admin: client.ApiClient, op: OperatorProcess, ns: str) -> None:
    """The operator's metrics filter at work: nobody (no review), a stranger (403), a reader (200)."""
    reader = service_account_token(admin, ns, "metrics-reader")
    binding = bind_to_metrics_reader(admin, ns, "metrics-reader", METRICS_READER)
    try:
        assert op.metrics_get()[0] == 401
        status, body = op.metrics_get(service_account_token(admin, ns, "stranger"))
        assert status == 403 and f"system:serviceaccount:{ns}:stranger" in body, body
        status, body = op.metrics_get(reader)
        assert status == 200 and "arbiter_operator_reconcile_total" in body, body
    finally:
        client.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(binding)


def test_operator_as_chart_service_account_is_never_forbidden_and_uses_every_grant(
    audited, admin, s3_server, prometheus_url, tmp_path
) -> None:
    cp, audit_log = audited
    identity = install_chart_identity(cp, admin, tmp_path)  # default values: all namespaces, one ClusterRole
    ns = _namespace(admin, "rbac")
    seed_model_storage(s3_server, admin, ns)
    # No --namespace: all namespaces, as the chart runs it by default.
    op = _operator(identity, [], tmp_path, prometheus_url, metrics=True)
    stuck: AssertionError | None = None
    try:
        _run_scenarios(admin, ns, identity.kubeconfig)
        _scrape_as_three_callers(admin, op, ns)
    except AssertionError as exc:
        stuck = exc  # a missing grant usually shows as a scenario that never converges: report the 403s first
    finally:
        op.stop()

    events = read_audit(audit_log, identity.username)
    assert events, "the audit log recorded nothing for the operator's ServiceAccount"
    denied = forbidden(events)
    assert not denied, "the operator was forbidden:\n" + "\n".join(sorted(set(denied)))
    if stuck is not None:
        raise stuck

    unused = {(g, r, v) for _ns, g, r, v in unused_grants(identity.rules, events)}
    unexplained = unused - NOT_EXERCISABLE
    assert not unexplained, (
        "the chart grants what no scenario used (remove the rule, or add the scenario that needs it):\n"
        + "\n".join(f"  {g or 'core'}/{r}: {v}" for g, r, v in sorted(unexplained))
        + "\nused: " + ", ".join(sorted(f"{g or 'core'}/{r}:{v}" for g, r, v in used_grants(events)))
    )
    # The exceptions are still granted (the chart needs them on OpenShift), and are the only unused ones.
    granted = {(g, r, v) for _ns, g, r, v in expand(identity.rules)}
    assert granted >= NOT_EXERCISABLE
    # The grants the operator makes (the callers', the shadow phase's) needed no right to escalate or bind roles.
    rbac_verbs = {v for _ns, _g, r, v in expand(identity.rules) if r in ("roles", "rolebindings", "clusterroles")}
    assert not rbac_verbs & {"escalate", "bind", "*"}, rbac_verbs


def test_namespaced_install_runs_with_roles_only(audited, admin, s3_server, tmp_path) -> None:
    cp, audit_log = audited
    ns = _namespace(admin, "roles")
    identity = install_chart_identity(
        cp, admin, tmp_path, values={"watchedNamespaces": [ns]}, release_namespace=f"arbiter-{ns}"
    )
    # Only a Role in the watched namespace, and cluster-wide nothing but reading and watching that namespace.
    cluster = [r for where, r in identity.rules if where is None]
    assert cluster == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"],
                        "resourceNames": [ns]}, *REVIEWS]
    seed_model_storage(s3_server, admin, ns)
    op = _operator(identity, [ns], tmp_path)
    stuck: AssertionError | None = None
    try:
        dm = example()
        create_dm(admin, ns, dm)
        _ready(admin, ns, dm["metadata"]["name"])
    except AssertionError as exc:
        stuck = exc
    finally:
        op.stop()
    events = read_audit(audit_log, identity.username)
    assert events
    denied = forbidden(events)
    assert not denied, "forbidden in the per-namespace mode:\n" + "\n".join(sorted(set(denied)))
    if stuck is not None:
        raise stuck
    # It never reached outside the namespace it watches, but for its leader Lease in its own (release) namespace.
    def own_lease(e):
        ref = e.get("objectRef") or {}
        return ref.get("namespace") == identity.namespace and ref.get("resource") == "leases"

    outside = [describe(e) for e in events
               if (e.get("objectRef") or {}).get("namespace") not in (None, ns) and not own_lease(e)]
    assert not outside, outside
    assert any(own_lease(e) for e in events)


def _may(admin: client.ApiClient, user: str, groups: list[str], **attributes: Any) -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(user=user, groups=groups,
                                                                                 **attributes))
    return bool(client.AuthorizationV1Api(admin).create_subject_access_review(review).status.allowed)


def test_the_metrics_reader_role_grants_get_on_metrics_and_nothing_else(audited, admin, tmp_path) -> None:
    cp, _ = audited
    install_chart_identity(cp, admin, tmp_path)
    role = client.RbacAuthorizationV1Api(admin).read_cluster_role(METRICS_READER)
    assert [(r.non_resource_urls, r.verbs, r.resources, r.api_groups) for r in role.rules] == [
        (["/metrics"], ["get"], None, None)]
    ns = _namespace(admin, "reader")
    binding = bind_to_metrics_reader(admin, ns, "scraper", METRICS_READER)
    # The role judged alone: no groups, since the cluster's own roles for every authenticated user (discovery,
    # /healthz, /version) would answer for some of the paths below whatever this role says.
    user, groups = f"system:serviceaccount:{ns}:scraper", []
    non_resource = client.V1NonResourceAttributes
    resource = client.V1ResourceAttributes
    try:
        assert _may(admin, user, groups, non_resource_attributes=non_resource(path="/metrics", verb="get"))
        for path, verb in (("/metrics", "post"), ("/metrics", "delete"), ("/metrics/vllm", "get"),
                           ("/healthz", "get"), ("/api", "get"), ("/metricsx", "get")):
            assert not _may(admin, user, groups, non_resource_attributes=non_resource(path=path, verb=verb)), path
        for group, plural, verb in (("", "pods", "list"), ("", "secrets", "get"), ("", "configmaps", "get"),
                                    ("authentication.k8s.io", "tokenreviews", "create"),
                                    ("serving.kserve.io", "inferenceservices", "get"),
                                    ("arbiter.dev", "decisionmodels", "get")):
            assert not _may(admin, user, groups, resource_attributes=resource(
                namespace=ns, group=group, resource=plural, verb=verb)), plural
    finally:
        client.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(binding)


def test_the_tenancy_ports_check_passes_where_the_operator_serves_and_nowhere_else(audited, admin, tmp_path) -> None:
    """The SubjectAccessReview Thanos Querier's tenancy port makes before it answers a query with the operator's
    token (kube-rbac-proxy: `pods.metrics.k8s.io` in the `namespace` URL parameter, the verb from the HTTP method),
    judged by the real authorizer against the chart's roles: a GET (what the operator's client sends) in a namespace
    it serves passes, a POST (`create`) does not, and neither does a namespace it does not serve."""
    cp, _ = audited
    served, other = _namespace(admin, "tenant"), _namespace(admin, "stranger")
    identity = install_chart_identity(cp, admin, tmp_path, values={"watchedNamespaces": [served]},
                                      release_namespace=f"arbiter-{served}")
    resource = client.V1ResourceAttributes
    user, groups = identity.username, ["system:serviceaccounts", f"system:serviceaccounts:{identity.namespace}"]

    def may(namespace: str, verb: str) -> bool:
        return _may(admin, user, groups, resource_attributes=resource(
            namespace=namespace, group="metrics.k8s.io", version="v1beta1", resource="pods", verb=verb))

    assert may(served, "get")
    assert not may(served, "create") and not may(other, "get")
    # The default install (all namespaces): one ClusterRole, so every namespace's check passes.
    everywhere = install_chart_identity(cp, admin, tmp_path)
    assert _may(admin, everywhere.username, [], resource_attributes=resource(
        namespace=other, group="metrics.k8s.io", version="v1beta1", resource="pods", verb="get"))
