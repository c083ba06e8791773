"""The chart ships the dashboards the two ways OpenShift users find them (templates/dashboards.yaml), rendered by the
real `helm` binary: the console's ConfigMaps in openshift-config-managed where the cluster serves
console.openshift.io/v1 (or when forced), a Grafana sidecar's in a namespace of choice."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from arbiter_devenv import dashboards as gen
from support.chartkit import RELEASE_NAMESPACE, lint, render, template
from support.paths import REPO

CONSOLE_API = "console.openshift.io/v1"
CONSOLE_NAMESPACE = "openshift-config-managed"
CONSOLE_LABEL = "console.openshift.io/dashboard"
GRAFANA_LABEL = "grafana_dashboard"
MiB = 1024 * 1024
COMMITTED = {f"{b.uid}.json": json.loads((REPO / gen.DASHBOARDS_DIR / f"{b.uid}.json").read_text())
             for b in gen.boards()}


def dashboards(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return [d for d in render(values, **kwargs)
            if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboards"]


def _one_dashboard_each(cms: list[dict[str, Any]]) -> None:
    """One ConfigMap per dashboard (the console reads a ConfigMap's first data key only), its JSON the committed
    file's, the whole object well under the 1 MiB an object may be."""
    assert sorted(key for cm in cms for key in cm["data"]) == sorted(COMMITTED)
    for cm in cms:
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == COMMITTED[key]
        assert len(json.dumps(cm).encode()) < MiB / 4, f"{cm['metadata']['name']} is close to the 1 MiB limit"
        name = cm["metadata"]["name"]
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name


def test_a_plain_render_has_no_dashboards() -> None:
    # Not OpenShift (helm does not know of the console's API) and no Grafana asked for.
    assert dashboards() == []


def test_on_openshift_the_console_gets_them_by_default() -> None:
    cms = dashboards(api_versions=[CONSOLE_API])
    assert len(cms) == 3
    _one_dashboard_each(cms)
    for cm in cms:
        assert cm["metadata"]["namespace"] == CONSOLE_NAMESPACE
        assert cm["metadata"]["labels"][CONSOLE_LABEL] == "true"
        assert GRAFANA_LABEL not in cm["metadata"]["labels"] and "annotations" not in cm["metadata"]
    assert sorted(cm["metadata"]["name"] for cm in cms) == [
        "arbiter-fleet-dashboard", "arbiter-model-dashboard", "arbiter-operator-dashboard"]


def test_the_console_dashboards_can_be_turned_off_or_forced() -> None:
    assert dashboards({"dashboards": {"console": {"enabled": False}}}, api_versions=[CONSOLE_API]) == []
    forced = dashboards({"dashboards": {"console": {"force": True}}})
    assert {cm["metadata"]["namespace"] for cm in forced} == {CONSOLE_NAMESPACE} and len(forced) == 3
    # Forcing does not switch on what is turned off.
    assert dashboards({"dashboards": {"console": {"enabled": False, "force": True}}}) == []


def test_grafana_gets_them_in_the_release_namespace_or_another() -> None:
    cms = dashboards({"dashboards": {"grafana": {"enabled": True}}})
    assert len(cms) == 3
    _one_dashboard_each(cms)
    for cm in cms:
        assert cm["metadata"]["namespace"] == RELEASE_NAMESPACE
        assert cm["metadata"]["labels"][GRAFANA_LABEL] == "1" and CONSOLE_LABEL not in cm["metadata"]["labels"]

    custom = dashboards({"dashboards": {"grafana": {
        "enabled": True, "namespace": "grafana", "labels": {"team": "sre"},
        "annotations": {"grafana_folder": "Arbiter"}}}})
    for cm in custom:
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["labels"][GRAFANA_LABEL] == "1" and cm["metadata"]["labels"]["team"] == "sre"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Arbiter"}
    # A sidecar watching another value of the label.
    other = dashboards({"dashboards": {"grafana": {"enabled": True, "labels": {GRAFANA_LABEL: "true"}}}})
    assert {cm["metadata"]["labels"][GRAFANA_LABEL] for cm in other} == {"true"}


def test_both_at_once_and_under_another_release_name() -> None:
    cms = dashboards({"dashboards": {"grafana": {"enabled": True}}}, api_versions=[CONSOLE_API], release="risk")
    assert len(cms) == 6
    by_namespace: dict[str, list[str]] = {}
    for cm in cms:
        by_namespace.setdefault(cm["metadata"]["namespace"], []).append(cm["metadata"]["name"])
        assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "risk"
    assert sorted(by_namespace) == sorted([CONSOLE_NAMESPACE, RELEASE_NAMESPACE])
    for names in by_namespace.values():
        assert sorted(names) == ["risk-arbiter-fleet-dashboard", "risk-arbiter-model-dashboard",
                                 "risk-arbiter-operator-dashboard"]
    # A 63-character full name still gives valid, distinct ConfigMap names.
    long = dashboards({"fullnameOverride": "a" * 63, "dashboards": {"console": {"force": True}}})
    assert len({cm["metadata"]["name"] for cm in long}) == 3
    _one_dashboard_each(long)


def test_lint_is_clean_with_every_dashboard_switched_on() -> None:
    proc = lint({"dashboards": {"console": {"force": True}, "grafana": {"enabled": True, "namespace": "grafana"}}})
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"dashboards": {"grafana": {"namespace": "Grafana NS"}}}, "/dashboards/grafana/namespace"),
    ({"dashboards": {"grafana": {"enabled": "yes"}}}, "/dashboards/grafana/enabled"),
    ({"dashboards": {"console": {"enable": True}}}, "enable"),
])
def test_bad_dashboard_values_fail_naming_them(values: dict[str, Any], message: str) -> None:
    proc = template(values, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_olm_bundle_carries_no_dashboards() -> None:
    """OLM installs a bundle's objects in the operator's namespace only: it cannot write openshift-config-managed, so
    the bundle has no dashboards (docs/install.md says how to add them)."""
    from arbiter_devenv import olmbundle

    files = olmbundle.render(REPO)
    assert not any(CONSOLE_NAMESPACE in text or CONSOLE_LABEL in text for text in files.values())
