"""The Helm chart as an SRE meets it: lint, the values they set, the errors they get, the objects they get."""

from __future__ import annotations

import filecmp
import json
import pathlib

import pytest
import yaml
from support.chartkit import (
    CHART,
    REPO,
    VALUES_SETS,
    lint,
    of_kind,
    one,
    render,
    restricted_violations,
    template,
    writable_mounts,
)


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_helm_lint_is_clean(name: str) -> None:
    proc = lint(VALUES_SETS[name])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_chart_crds_are_identical_to_the_repository_crds() -> None:
    repo_crds = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    chart_crds = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert "arbiter.dev_decisionmodels.yaml" in repo_crds
    assert chart_crds == repo_crds, "helm/arbiter/crds/ must hold exactly the files of crds/"
    drifted = [n for n in repo_crds if not filecmp.cmp(REPO / "crds" / n, CHART / "crds" / n, shallow=False)]
    assert not drifted, (f"helm/arbiter/crds/{drifted[0]} is stale: run "
                         ".venv/bin/python tests/support/sync_chart_copies.py")


def test_crds_ship_with_the_chart_install() -> None:
    docs = render(include_crds=True)
    crd = one(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "decisionmodels.arbiter.dev"


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_deployment_runs_replicas_that_elect_a_leader(name: str) -> None:
    docs = render(VALUES_SETS[name])
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    # Two replicas; only the holder of the Lease reconciles, so an upgrade may add the new pod before the old goes.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (container,) = spec["template"]["spec"]["containers"]
    assert "--leader-elect" in container["args"]
    assert {"--lease-duration=15", "--renew-deadline=10", "--retry-period=2"} <= set(container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["ARBITER_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    accounts = [a["metadata"]["name"] for a in of_kind(docs, "ServiceAccount")]
    assert spec["template"]["spec"]["serviceAccountName"] == "arbiter" and "arbiter" in accounts
    # A node drain keeps one operator pod.
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    # The Lease is granted in the release namespace only, and only what leader election does with it.
    lease_rules = [(d["kind"], d["metadata"].get("namespace"), r) for d in docs if d["kind"] in ("Role", "ClusterRole")
                   for r in d["rules"] if "leases" in r.get("resources", [])]
    assert lease_rules == [("Role", dep["metadata"]["namespace"],
                            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                             "verbs": ["get", "create", "update"]})]


def test_one_replica_has_no_disruption_budget() -> None:
    docs = render({"replicaCount": 1})
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]


def _aggregated(doc) -> bool:
    """A ClusterRole aggregated into people's admin/edit/view roles."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in (doc["metadata"].get("labels") or {}))


def _operator_only(docs):
    """The chart's documents less the ClusterRoles for others: people's (aggregated) and scrapers' (metrics-reader)."""
    return [d for d in docs if not _aggregated(d) and not d["metadata"]["name"].endswith("-metrics-reader")]


REVIEW_RULES = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]


def test_default_install_watches_all_namespaces_with_a_cluster_role() -> None:
    docs = render()
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    # No --namespace: the operator watches every namespace.
    assert not [a for a in container["args"] if a.startswith("--namespace")]
    # Namespaced grants: only leader election's, in the release namespace.
    assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in of_kind(docs, "Role")] == [
        ("arbiter-leader-election", "arbiter-system")]
    assert [b["roleRef"]["name"] for b in of_kind(docs, "RoleBinding")] == ["arbiter-leader-election"]
    role = one(_operator_only(docs), "ClusterRole")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"decisionmodels", "inferenceservices", "routes", "configmaps"} <= resources
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "arbiter", "namespace": "arbiter-system"}]


def test_a_namespace_list_switches_the_cluster_role_to_roles() -> None:
    docs = render({"watchedNamespaces": ["team-a", "team-b"]})
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    roles = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] != "arbiter-leader-election"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in of_kind(docs, "RoleBinding")
                  if b["metadata"]["name"] != "arbiter-leader-election") == ["team-a", "team-b"]
    # What stays cluster-wide: only get/list/watch on exactly the watched namespaces (their mesh labels), and the
    # metrics filter's reviews (cluster-scoped objects, never stored).
    (cluster_role,) = of_kind(_operator_only(docs), "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"],
         "resourceNames": ["team-a", "team-b"]}, *REVIEW_RULES]
    # The namespaced rules are the ones the all-namespaces ClusterRole grants, no more.
    all_ns_rules = one(_operator_only(render()), "ClusterRole")["rules"]
    for role in roles:
        assert all(rule in all_ns_rules for rule in role["rules"])


def test_people_get_decisionmodels_through_aggregated_default_roles() -> None:
    aggregated = [d for d in of_kind(render(), "ClusterRole") if _aggregated(d)]
    by_label = {k: d for d in aggregated for k in d["metadata"]["labels"] if k.startswith("rbac.authorization")}
    write = {"create", "delete", "patch", "update"}
    for role in ("admin", "edit"):
        rules = by_label[f"rbac.authorization.k8s.io/aggregate-to-{role}"]["rules"]
        assert any(r["resources"] == ["decisionmodels"] and write <= set(r["verbs"]) for r in rules)
        assert not any("decisionmodels/status" in r["resources"] and write & set(r["verbs"]) for r in rules)
    view = by_label["rbac.authorization.k8s.io/aggregate-to-view"]["rules"]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in view)
    assert not [d for d in of_kind(render({"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")
                if _aggregated(d)]


def test_no_rule_uses_wildcards_or_writes_secrets() -> None:
    for name, values in VALUES_SETS.items():
        docs = render(values)
        for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                    assert "*" not in rule.get(key, []), f"{name}: wildcard in {rule}"
                if "secrets" in rule.get("resources", []):
                    assert rule["verbs"] == ["get"], f"{name}: Secrets must be read by name only: {rule}"
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


@pytest.mark.parametrize("name", sorted(VALUES_SETS))
def test_operator_pod_passes_restricted_v2(name: str) -> None:
    pod_spec = one(render(VALUES_SETS[name]), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod_spec) == []
    (container,) = pod_spec["containers"]
    # Read-only root: the only writable place is the /tmp emptyDir.
    assert writable_mounts(container) == ["/tmp"]
    tmp = next(v for v in pod_spec["volumes"] if v["name"] == "tmp")
    assert "emptyDir" in tmp


def test_restricted_checker_catches_what_openshift_refuses() -> None:
    # The checker is what the other tests lean on: show it rejects each thing restricted-v2 rejects.
    good = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(good) == []

    def mutate(fn):
        spec = json.loads(json.dumps(good))
        fn(spec)
        return restricted_violations(spec)

    c = lambda s: s["containers"][0]["securityContext"]  # noqa: E731
    assert mutate(lambda s: s["securityContext"].update(runAsUser=1000))
    assert mutate(lambda s: s["securityContext"].update(fsGroup=1000))
    assert mutate(lambda s: c(s).update(allowPrivilegeEscalation=True))
    assert mutate(lambda s: c(s).pop("allowPrivilegeEscalation"))
    assert mutate(lambda s: c(s).update(capabilities={"drop": ["NET_RAW"]}))
    assert mutate(lambda s: c(s).update(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}))
    assert mutate(lambda s: (c(s).pop("runAsNonRoot"), s["securityContext"].pop("runAsNonRoot")))
    assert mutate(lambda s: (c(s).pop("seccompProfile"), s["securityContext"].pop("seccompProfile")))
    assert mutate(lambda s: c(s).update(readOnlyRootFilesystem=False))
    assert mutate(lambda s: c(s).update(privileged=True))
    assert mutate(lambda s: s.update(hostNetwork=True))
    assert mutate(lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}))


def test_credentials_reach_the_operator_as_files_never_as_env() -> None:
    docs = render(VALUES_SETS["everything"])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert not [e for e in container["env"] if "secretKeyRef" in (e.get("valueFrom") or {})]
    assert not container.get("envFrom")
    assert env["ARBITER_PROMETHEUS_TOKEN_FILE"]["value"] == "/var/run/secrets/arbiter/prometheus/token"
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert secrets["prometheus-token"]["secretName"] == "prometheus-token"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-token"]["readOnly"]


def test_prometheus_settings_reach_the_operator() -> None:
    (container,) = one(render(VALUES_SETS["everything"]), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ARBITER_PROMETHEUS_URL"] == "https://thanos-querier.openshift-monitoring.svc:9091"
    assert env["ARBITER_PROMETHEUS_TENANCY"] == "false"
    assert env["ARBITER_PROMETHEUS_CA_FILE"] == "/etc/arbiter/prometheus-ca/service-ca.crt"
    assert "--log-level=info" in container["args"]
    assert "--metrics-port=9090" in container["args"]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_by_default_prometheus_is_the_tenancy_port_with_the_operators_own_rotated_token(name: str) -> None:
    docs = render(VALUES_SETS[name])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ARBITER_PROMETHEUS_URL"] == "https://thanos-querier.openshift-monitoring.svc:9092"
    assert env["ARBITER_PROMETHEUS_TENANCY"] == "true"
    # The token: the operator's own ServiceAccount's, projected with a bounded lifetime and renewed by the kubelet;
    # no Secret holds it, and the operator re-reads the file on every query.
    assert env["ARBITER_PROMETHEUS_TOKEN_FILE"] == "/var/run/secrets/arbiter/prometheus/token"
    volumes = {v["name"]: v for v in pod["volumes"]}
    (source,) = volumes["prometheus-token"]["projected"]["sources"]
    assert source == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-token"]["mountPath"] == "/var/run/secrets/arbiter/prometheus"
    # The CA: OpenShift's service CA, which every namespace holds as openshift-service-ca.crt.
    assert volumes["prometheus-ca"]["configMap"]["name"] == "openshift-service-ca.crt"
    assert env["ARBITER_PROMETHEUS_CA_FILE"] == "/etc/arbiter/prometheus-ca/service-ca.crt"
    # The tenancy port's kube-rbac-proxy asks whether the token may `get pods.metrics.k8s.io` in the namespace: the
    # operator's role in the namespaces it serves grants that, and no cluster-wide metrics read.
    metrics_rules = [(d["kind"], tuple(r["verbs"])) for d in docs if d["kind"] in ("Role", "ClusterRole")
                     for r in d["rules"] if "metrics.k8s.io" in r.get("apiGroups", [])]
    expected = ("ClusterRole", ("get",)) if name == "defaults" else ("Role", ("get",))
    assert metrics_rules and set(metrics_rules) == {expected}
    assert "cluster-monitoring-view" not in json.dumps(docs)


def test_without_tenancy_the_operator_gets_no_metrics_grant() -> None:
    docs = render({"prometheus": {"tenancy": False, "url": "http://prometheus.monitoring:9090",
                                  "caConfigMap": {"name": ""}}})
    assert not [r for d in docs if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == "arbiter"
                for r in d["rules"] if "metrics.k8s.io" in r.get("apiGroups", [])]
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "ARBITER_PROMETHEUS_CA_FILE" not in env and env["ARBITER_PROMETHEUS_TENANCY"] == "false"


def test_replicas_spread_over_nodes_by_default() -> None:
    spec = one(render({}), "Deployment")["spec"]["template"]["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node cluster still runs both replicas
    assert spread["labelSelector"]["matchLabels"].items() <= spec_labels(render({})).items()
    strict = one(render({"topologySpread": {"whenUnsatisfiable": "DoNotSchedule"}}), "Deployment")
    assert strict["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    # One replica has nothing to spread; turned off, none is rendered.
    assert "topologySpreadConstraints" not in one(render({"replicaCount": 1}), "Deployment")["spec"]["template"]["spec"]
    off = one(render({"topologySpread": {"enabled": False}}), "Deployment")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in off


def spec_labels(docs: list[dict]) -> dict[str, str]:
    return one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]


def test_image_by_digest_wins_over_tag() -> None:
    (c,) = one(render(VALUES_SETS["everything"]), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example.com/arbiter/operator@sha256:" + "a" * 64
    (c,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert c["image"] == f"quay.io/arbiter-dev/arbiter-operator:{chart['appVersion']}"


def test_metrics_service_service_monitor_and_network_policy() -> None:
    default = render()
    assert of_kind(default, "Service") and not of_kind(default, "ServiceMonitor")
    assert not of_kind(default, "NetworkPolicy")
    docs = render(VALUES_SETS["everything"])
    (svc,) = [d for d in of_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics")]
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["metadata"]["labels"]["team"] == "platform"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    np = one(docs, "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    # The apiserver reaches the admission webhook from the control plane's network.
    assert {"ports": [{"port": "webhook", "protocol": "TCP"}]} in np["spec"]["ingress"]


def test_the_metrics_endpoint_is_https_from_openshifts_service_ca_and_scraped_with_a_reader_token() -> None:
    docs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    (svc,) = [d for d in of_kind(docs, "Service") if d["metadata"]["name"] == "arbiter-metrics"]
    assert svc["metadata"]["annotations"] == {
        "service.beta.openshift.io/serving-cert-secret-name": "arbiter-metrics-tls"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"--metrics-port=9090", "--metrics-auth=true", "--metrics-cert-dir=/etc/arbiter/metrics-tls",
            "--metrics-reader-secret=arbiter-metrics-reader"} <= set(container["args"])
    assert {"name": "metrics-tls", "mountPath": "/etc/arbiter/metrics-tls", "readOnly": True} in \
        container["volumeMounts"]
    assert {"name": "metrics-tls", "secret": {"secretName": "arbiter-metrics-tls", "defaultMode": 0o440, "items": [
        {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}} in pod["volumes"]
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["honorLabels"] is True
    assert endpoint["tlsConfig"] == {"serverName": "arbiter-metrics.arbiter-system.svc", "ca": {
        "configMap": {"name": "openshift-service-ca.crt", "key": "service-ca.crt"}}}
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": "arbiter-metrics-reader", "key": "token"}}
    assert "bearerTokenFile" not in endpoint  # OpenShift user-workload monitoring refuses it
    # The reader: a ServiceAccount, its token Secret, bound to the metrics-reader ClusterRole, which grants only
    # `get` on /metrics.
    reader = next(d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "arbiter-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    accounts = sorted(a["metadata"]["name"] for a in of_kind(docs, "ServiceAccount"))
    assert accounts == ["arbiter", "arbiter-metrics-reader"]
    (secret,) = of_kind(docs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token" and secret["metadata"]["name"] == \
        "arbiter-metrics-reader"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "arbiter-metrics-reader"}
    binding = next(d for d in of_kind(docs, "ClusterRoleBinding") if d["metadata"]["name"] == "arbiter-metrics-reader")
    assert binding["roleRef"]["name"] == "arbiter-metrics-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "arbiter-metrics-reader",
                                    "namespace": "arbiter-system"}]
    # The operator reviews the scrapers' tokens.
    operator_role = one(_operator_only(docs), "ClusterRole")
    assert all(rule in operator_role["rules"] for rule in REVIEW_RULES)


def test_the_metrics_certificate_modes_follow_the_webhooks() -> None:
    def parts(values: dict) -> tuple[list[dict], dict, dict]:
        docs = render({"metrics": {"serviceMonitor": {"enabled": True}, **values}})
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
        return docs, pod, endpoint

    docs, pod, endpoint = parts({"certificates": "certManager"})
    assert one([d for d in of_kind(docs, "Certificate") if d["metadata"]["name"] == "arbiter-metrics"],
               "Certificate")["spec"]["dnsNames"][0] == "arbiter-metrics.arbiter-system.svc"
    assert "arbiter-metrics" in [d["metadata"]["name"] for d in of_kind(docs, "Issuer")]  # self-signed: no issuerRef
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "arbiter-metrics-tls", "key": "ca.crt"}}
    docs, pod, endpoint = parts({"certificates": "secret", "secret": {"name": "my-metrics-tls"}})
    assert {v["name"]: v for v in pod["volumes"]}["metrics-tls"]["secret"]["secretName"] == "my-metrics-tls"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "my-metrics-tls", "key": "ca.crt"}}
    docs, pod, endpoint = parts({"certificates": "none"})
    (container,) = pod["containers"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint
    assert not [a for a in container["args"] if a.startswith("--metrics-cert-dir")]
    assert "metrics-tls" not in {v["name"] for v in pod["volumes"]}
    docs, pod, endpoint = parts({"serviceMonitor": {"enabled": True, "tlsConfig": {"insecureSkipVerify": True}}})
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # Auth off: no reader identity, no reviews, no credentials; the ClusterRole stays for the runtimes' scrapers.
    docs, pod, endpoint = parts({"auth": False})
    assert "authorization" not in endpoint and "--metrics-auth=false" in pod["containers"][0]["args"]
    assert [d["kind"] for d in docs if d["metadata"]["name"].endswith("-metrics-reader")] == ["ClusterRole"]
    assert not any(rule in one(_operator_only(docs), "ClusterRole")["rules"] for rule in REVIEW_RULES)
    # Another reader Secret name for the PodMonitors.
    docs, pod, endpoint = parts({"readerSecret": "prometheus-reader"})
    assert "--metrics-reader-secret=prometheus-reader" in pod["containers"][0]["args"]


def _webhook(docs: list[dict]) -> tuple[dict, dict, dict]:
    hook = one(docs, "ValidatingWebhookConfiguration")
    (svc,) = [d for d in of_kind(docs, "Service") if d["metadata"]["name"].endswith("-webhook")]
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return hook, svc, container


def test_the_admission_webhook_reaches_the_operators_port_with_openshifts_service_ca_by_default() -> None:
    docs = render()
    hook, svc, container = _webhook(docs)
    (webhook,) = hook["webhooks"]
    assert webhook["failurePolicy"] == "Ignore" and webhook["timeoutSeconds"] == 5
    assert webhook["clientConfig"]["service"] == {"name": svc["metadata"]["name"], "namespace": "arbiter-system",
                                                  "path": "/decisionmodels", "port": 443}
    assert webhook["rules"][0]["resources"] == ["decisionmodels"] and "namespaceSelector" not in webhook
    assert svc["spec"]["ports"][0]["targetPort"] == "webhook"
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    assert "--webhook-port=9443" in container["args"] and "--webhook-cert-dir=/etc/arbiter/webhook-tls" in \
        container["args"]
    secret = svc["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"]
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": secret, "defaultMode": 0o440, "items": [
        {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}} in volumes
    assert hook["metadata"]["annotations"] == {"service.beta.openshift.io/inject-cabundle": "true"}
    # A namespace list scopes the webhook to it; cert-manager and a given Secret are the other sources.
    (listed,) = one(render({"watchedNamespaces": ["team-a"]}), "ValidatingWebhookConfiguration")["webhooks"]
    assert listed["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]
    cm = render({"webhook": {"certificates": "certManager"}})
    assert one(cm, "Certificate")["spec"]["secretName"] == secret and of_kind(cm, "Issuer")
    given = render({"webhook": {"certificates": "secret", "secret": {"name": "my-tls", "caBundle": "Q0E="}}})
    hook, _, _ = _webhook(given)
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    assert not of_kind(render({"webhook": {"enabled": False}}), "ValidatingWebhookConfiguration")


def test_a_shard_owns_the_namespaces_its_selector_matches_and_has_its_own_lease() -> None:
    docs = render({"namespaceSelector": "arbiter.dev/shard in (risk,fraud)",
                   "leaderElection": {"leaseName": "arbiter-shard-risk"}})
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--namespace-selector=arbiter.dev/shard in (risk,fraud)" in container["args"]
    assert "--leader-election-id=arbiter-shard-risk" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--namespace=")]
    # Namespaces come and go with their labels: the grants are the all-namespaces ClusterRole's.
    assert one(_operator_only(docs), "ClusterRole")["rules"] == one(_operator_only(render()), "ClusterRole")["rules"]
    # A single operator keeps the Lease name every earlier release used, so an upgrade hands over through it.
    (default,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--leader-election-id=arbiter-operator-leader" in default["args"]


# Bad values fail at install with a message that names the value: (values, text the error must contain).
BAD_VALUES = [
    ({"logLevel": "verbose"}, "logLevel"),
    ({"replicaCount": 0}, "replicaCount"),
    ({"leaderElection": {"leaseDuration": 10, "renewDeadline": 10, "retryPeriod": 2}}, "renewDeadline < leaseDuration"),
    ({"watchedNamespaces": ["Team_A"]}, "watchedNamespaces"),
    ({"watchedNamespaces": "team-a"}, "watchedNamespaces"),
    ({"namespaceSelector": "shard=a", "watchedNamespaces": ["team-a"]}, "namespaceSelector and watchedNamespaces"),
    ({"leaderElection": {"leaseName": "Shard A"}}, "leaseName"),
    ({"image": {"digest": "latest"}}, "digest"),
    ({"image": {"repository": "quay.io/arbiter/operator:1.0"}}, "repository"),
    ({"metrics": {"port": 80}}, "/metrics/port"),
    ({"prometheus": {"url": "thanos-querier:9091"}}, "/prometheus/url"),
    ({"prometheus": {"tokenSecret": {"name": "Bad Name"}}}, "/prometheus/tokenSecret/name"),
    ({"resources": {"limit": {"memory": "1Gi"}}}, "limit"),
    ({"metrics": {"serviceMonitor": {"enabled": True, "interval": "thirty"}}}, "interval"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
    ({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}, "metrics.service.enabled"),
    ({"webhook": {"certificates": "secret"}}, "webhook.secret.name"),
    ({"webhook": {"certificates": "selfSigned"}}, "/webhook/certificates"),
    ({"webhook": {"failurePolicy": "Deny"}}, "/webhook/failurePolicy"),
    ({"dashboards": {"grafana": {"namespace": "Grafana NS"}}}, "/dashboards/grafana/namespace"),
    ({"dashboards": {"console": {"enable": True}}}, "enable"),
    ({"metrics": {"certificates": "selfSigned"}}, "/metrics/certificates"),
    ({"metrics": {"certificates": "secret"}}, "metrics.secret.name"),
    ({"metrics": {"auth": "yes"}}, "/metrics/auth"),
    ({"metrics": {"readerSecret": "Reader_Secret"}}, "/metrics/readerSecret"),
    ({"prometheus": {"tenancy": "yes"}}, "/prometheus/tenancy"),
    ({"prometheus": {"tokenExpirationSeconds": 60}}, "/prometheus/tokenExpirationSeconds"),
    ({"topologySpread": {"whenUnsatisfiable": "Never"}}, "/topologySpread/whenUnsatisfiable"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_fail_with_a_message_naming_them(values: dict, message: str) -> None:
    proc = template(values, check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    assert message in proc.stderr, proc.stderr


def test_argocd_health_check_snippet_in_docs_matches_the_chart() -> None:
    lua_files = sorted((CHART / "health").glob("*.lua"))
    assert lua_files, "helm/arbiter/health/ must ship the Argo CD health check"
    install = (REPO / "docs" / "install.md").read_text()
    for lua in lua_files:
        body = lua.read_text().strip("\n")
        indented = "\n".join(("    " + line) if line else "" for line in body.splitlines())
        assert indented in install, (f"docs/install.md: argocd-cm snippet drifted from {lua.relative_to(REPO)}; "
                                     "run tests/support/sync_chart_copies.py")
    assert "resource.customizations.health.arbiter.dev_DecisionModel" in install


def test_docs_name_every_value_an_sre_sets() -> None:
    install = (REPO / "docs" / "install.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in values:
        assert f"`{key}" in install, f"docs/install.md does not explain the value {key}"


def test_values_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict, sch: dict, path: str) -> None:
        props = sch.get("properties", {})
        for key, val in node.items():
            assert key in props, f"values.schema.json lacks {path}{key}"
            if isinstance(val, dict) and props[key].get("properties"):
                walk(val, props[key], f"{path}{key}.")

    walk(values, schema, "")
    assert schema.get("additionalProperties") is False


def test_chart_files_are_what_helm_packages() -> None:
    # helm package refuses symlinks out of the chart and would ship stray files; keep the chart folder clean.
    for path in CHART.rglob("*"):
        assert not path.is_symlink(), path
        assert path.suffix not in {".pyc", ".orig", ".rej"}, path
    assert pathlib.Path(CHART / "values.schema.json").is_file()


def test_runtime_image_is_an_operator_setting() -> None:
    def env(values):
        (container,) = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container.get("env", [])}

    assert "ARBITER_RUNTIME_IMAGE" not in env(None)  # the image released with the operator
    image = "mirror.example.com/arbiter/arbiter-runtime@sha256:" + "a" * 64
    assert env({"runtime": {"image": image}})["ARBITER_RUNTIME_IMAGE"] == image
