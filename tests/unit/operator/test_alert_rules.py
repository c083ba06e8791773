"""Every alert Arbiter ships, tested by promtool (Prometheus' own rule evaluator) firing and not firing.

The rules are made the way a cluster gets them: the chart's PrometheusRule by the real `helm` binary (release
`arbiter`), a DecisionModel's by the operator's renderer (render/prometheusrule.py) for examples/decisionmodel-canary
with version 1.1.0 promising a looser fallback rate. The scenarios live in tests/promtool/*.test.yaml, next to what
each alert's annotations say to the person paged.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.render.prometheusrule import render_prometheusrule
from support.chartkit import of_kind, render
from support.examples import example
from support.paths import REPO

SCENARIOS = REPO / "tests" / "promtool"
OPERATIONS = REPO / "docs" / "operations.md"


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: it comes with Debian's prometheus package (hack/setup.sh installs it)"
    return path


def chart_groups() -> list[dict[str, Any]]:
    docs = render({"alerts": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}})
    (rule,) = of_kind(docs, "PrometheusRule")
    return rule["spec"]["groups"]


def model_groups() -> list[dict[str, Any]]:
    doc = example("decisionmodel-canary.yaml")
    doc["metadata"]["namespace"] = "team-a"
    loose = next(v for v in doc["spec"]["versions"] if v["name"] == "1.1.0")
    loose["metadata"] = copy.deepcopy(loose["metadata"])  # the example's versions share one metadata (a YAML anchor)
    loose["metadata"]["sla"]["maxFallbackRate"] = 0.2
    return render_prometheusrule(DecisionModel.model_validate(doc))["spec"]["groups"]


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("promtool")
    for name, groups in (("operator-rules.yaml", chart_groups()), ("model-rules.yaml", model_groups())):
        (d / name).write_text(yaml.safe_dump({"groups": groups}))
    for scenario in SCENARIOS.glob("*.test.yaml"):
        shutil.copy(scenario, d / scenario.name)
    return d


def _alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_rules_pass_promtools_checks(rules_dir):
    proc = subprocess.run([_promtool(), "check", "rules", "operator-rules.yaml", "model-rules.yaml"], cwd=rules_dir,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_scenario_passes_in_promtool(rules_dir):
    files = sorted(p.name for p in rules_dir.glob("*.test.yaml"))
    proc = subprocess.run([_promtool(), "test", "rules", *files], cwd=rules_dir, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    fired: set[str] = set()
    quiet: set[str] = set()
    for scenario in SCENARIOS.glob("*.test.yaml"):
        for test in yaml.safe_load(scenario.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {r["alert"] for r in _alerts(chart_groups()) + _alerts(model_groups())}
    assert names - fired == set(), "alerts no scenario makes fire"
    assert names - quiet == set(), "alerts no scenario shows quiet"


def test_every_alert_has_a_severity_and_a_runbook_section():
    headings = {re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
                for line in OPERATIONS.read_text().splitlines() if line.startswith("#")}
    for rule in _alerts(chart_groups()) + _alerts(model_groups()):
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("https://") and url.endswith("#" + rule["alert"].lower()), url
        assert rule["alert"].lower() in headings, f"docs/operations.md has no section {rule['alert']}"
