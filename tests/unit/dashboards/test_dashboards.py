"""The dashboards the chart ships (devenv/arbiter_devenv/dashboards.py -> helm/arbiter/dashboards/*.json): committed
as generated, valid for grafana-foundation-sdk's dashboard types, within what the OpenShift console renders, and
reading only metric families that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import prometheus_client
import pytest
import yaml
from arbiter_devenv import dashboards as gen
from arbiter_runtime.metrics import Metrics
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import table as tm
from support.paths import REPO

FILES = {rel: json.loads((REPO / rel).read_text()) for rel in gen.render()}
UIDS = {"arbiter-model", "arbiter-fleet", "arbiter-operator"}

# The metric interface besides what the runtime's and the operator's registries hold today (read from them below):
# series being added to both (as the dashboards' specification names them), vLLM's re-exported from the predictor
# pods, and NVIDIA's DCGM exporter. Written out here, not taken from the generator, so a typo on either side fails.
NEW_RUNTIME = {"arbiter_decision_latency_objective_seconds", "arbiter_decisions_over_objective_total",
               "arbiter_vllm_process_cpu_seconds_total"}
NEW_OPERATOR = {
    "arbiter_build_info", "arbiter_decisionmodel_info", "arbiter_decisionmodel_phase",
    "arbiter_decisionmodel_condition", "arbiter_decisionmodel_traffic_weight", "arbiter_decisionmodel_promotion_step",
    "arbiter_decisionmodel_promotion_started_timestamp_seconds", "arbiter_decisionmodel_analysis",
    "arbiter_decisionmodel_gate_value", "arbiter_decisionmodel_gate_bound",
    "arbiter_decisionmodel_promotion_last_finished_timestamp_seconds", "arbiter_decisionmodel_gpus",
}
VLLM = {"vllm:kv_cache_usage_perc", "vllm:request_queue_time_seconds_bucket", "vllm:num_requests_waiting",
        "vllm:num_requests_running"}
DCGM = {"DCGM_FI_DEV_GPU_UTIL"}


def _exposed(registry: prometheus_client.CollectorRegistry) -> set[str]:
    """The sample names a registry's families are scraped as (whether or not a child exists yet)."""
    out: set[str] = set()
    for family in registry.collect():
        name = family.name
        out |= {
            "counter": {f"{name}_total"},
            "histogram": {f"{name}_bucket", f"{name}_sum", f"{name}_count"},
            "summary": {name, f"{name}_sum", f"{name}_count"},
            "info": {f"{name}_info"},
        }.get(family.type, {name})
    return out


def known_families() -> set[str]:
    import arbiter_operator.metrics  # noqa: F401  (registers the operator's families on the default registry)

    runtime = _exposed(Metrics("m", "v").registry)
    # The operator serves the default registry: its own families and prometheus_client's process collector.
    operator = {n for n in _exposed(prometheus_client.REGISTRY) if n.startswith(("arbiter_", "process_"))}
    return runtime | operator | NEW_RUNTIME | NEW_OPERATOR | VLLM | DCGM


_FUNCTION_OR_KEYWORD = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                        "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers, ranges and label
    lists that are neither a function, an aggregation nor a keyword."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or re.match(r"(by|without)\b", rest) or m.group(0).lower() in _FUNCTION_OR_KEYWORD:
            continue
        names.add(m.group(0))
    return names


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, in order (a collapsed row's own panels after it)."""
    out = []
    for p in doc["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(doc) if p["type"] != "row" for t in p["targets"]]


# ------------------------------------------------------------------ generated and committed


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    for rel, text in gen.render().items():
        path = REPO / rel
        assert path.is_file(), f"{rel} is missing: run python -m arbiter_devenv.dashboards"
        assert path.read_text() == text, f"{rel} drifted from its generator: run python -m arbiter_devenv.dashboards"
    assert gen.main(["--check"]) == 0
    assert {d["uid"] for d in FILES.values()} == UIDS
    assert sorted(p.name for p in (REPO / gen.DASHBOARDS_DIR).iterdir()) == sorted(f"{u}.json" for u in UIDS)


def test_check_mode_reports_a_hand_edit(tmp_path, monkeypatch, capsys) -> None:
    for rel, text in gen.render().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edited = tmp_path / gen.DASHBOARDS_DIR / "arbiter-fleet.json"
    edited.write_text(edited.read_text().replace('"Arbiter / Fleet"', '"Fleet (edited)"'))
    monkeypatch.setattr(gen, "repo_root", lambda: tmp_path)
    assert gen.main(["--check"]) == 1
    assert "Fleet (edited)" in capsys.readouterr().out
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


# ------------------------------------------------------------------ grafana-foundation-sdk's types


def _without_legacy(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for p in panels(doc):
        for key in gen.LEGACY_KEYS:
            p.pop(key, None)
    return doc


@pytest.mark.parametrize("rel", sorted(FILES))
def test_dashboard_round_trips_through_the_sdk_types(rel: str) -> None:
    """Decoded by the SDK's model (with its panel and query plugins registered) and encoded again, the dashboard is
    unchanged but for the console's legacy keys: nothing in it is outside the SDK's schema, nothing it requires is
    missing (the decoder would fill in a default and the comparison fail)."""
    plugins.register_default_plugins()
    doc = _without_legacy(FILES[rel])
    decoded = dm.Dashboard.from_json(doc)
    assert json.loads(json.dumps(decoded, cls=JSONEncoder)) == doc

    # Typed, not bags of JSON: enums hold, queries are Prometheus queries, table options are the table plugin's.
    dm.DashboardCursorSync(decoded.graph_tooltip)
    assert decoded.uid in UIDS and decoded.title and decoded.schema_version >= 36
    for var in decoded.templating.list_val or []:
        dm.VariableType(var.type_val), dm.VariableHide(var.hide)
        if var.type_val == dm.VariableType.QUERY:
            assert var.refresh is not None
            dm.VariableRefresh(var.refresh), dm.VariableSort(var.sort)
    assert decoded.panels
    for panel in decoded.panels:
        assert isinstance(panel, dm.RowPanel | dm.Panel)
        assert panel.grid_pos is not None
        g = panel.grid_pos
        assert g.h > 0 and 0 < g.w <= 24 and g.x >= 0 and g.x + g.w <= 24 and g.y >= 0
        if isinstance(panel, dm.RowPanel):
            assert not panel.collapsed and not panel.panels  # its panels follow it (both renderers group them)
            continue
        assert panel.targets
        for target in panel.targets:
            assert isinstance(target, pm.Dataquery), type(target)
            if target.format_val is not None:
                pm.PromQueryFormat(target.format_val)
        if panel.type_val == "table":
            assert isinstance(panel.options, tm.Options)


def test_only_the_legacy_keys_are_outside_the_sdk_schema() -> None:
    """Each legacy key is one the SDK's encoder does not write (were it in the schema, the round trip would keep it
    and the generator should use the SDK for it)."""
    plugins.register_default_plugins()
    for doc in FILES.values():
        encoded = json.loads(json.dumps(dm.Dashboard.from_json(doc), cls=JSONEncoder))
        for before, after in zip(panels(doc), panels(encoded), strict=True):
            assert set(before) - set(after) <= gen.LEGACY_KEYS, before["title"]


# ------------------------------------------------------------------ what the OpenShift console renders


@pytest.mark.parametrize("rel", sorted(FILES))
def test_every_panel_has_a_title_a_query_and_a_type_the_console_renders(rel: str) -> None:
    doc = FILES[rel]
    assert doc["panels"][0]["type"] == "row", "the console groups panels under the row before them"
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    for p in panels(doc):
        assert p["type"] in gen.CONSOLE_PANEL_TYPES, f"{p.get('title')}: the console skips {p['type']} panels"
        assert p.get("title", "").strip()
        if p["type"] == "row":
            assert p["showTitle"] is True
            continue
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(refs)
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            # The console prints legendFormat as written (labels in {{ }} filled in): no Grafana-only "__auto".
            assert t.get("legendFormat", "x") and t.get("legendFormat") != "__auto"
        assert p["description"].strip()
    # Titles identify a panel in a dashboard (panel_queries, the docs).
    titles = [p["title"] for p in panels(doc) if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    assert {p["type"] for p in panels(doc)} <= {"row", "graph", "singlestat", "table"}


@pytest.mark.parametrize("rel", sorted(FILES))
def test_legacy_keys_say_what_the_sdk_fields_say(rel: str) -> None:
    """The console reads the legacy keys, Grafana the SDK's fields: both from one specification, so they agree."""
    for p in panels(FILES[rel]):
        if p["type"] == "row":
            continue
        assert p["span"] == max(1, round(p["gridPos"]["w"] / 2))
        unit = p["fieldConfig"]["defaults"].get("unit")
        if p["type"] == "graph":
            assert p["yaxes"][0]["format"] == unit and unit in gen.CONSOLE_UNITS
            assert p["legend"] == {"show": True} and isinstance(p["stack"], bool)
        elif p["type"] == "singlestat":
            assert p["format"] == unit and unit in gen.CONSOLE_UNITS
            assert p["valueName"] == "current" and all(t.get("instant") for t in p["targets"])
        else:
            _table_agrees(p)


def _table_agrees(p: dict[str, Any]) -> None:
    """The console's `styles` and Grafana's organize transformation name the same columns, in the same order."""
    assert p["styles"], f"{p['title']}: the console refuses a table without styles"
    refs = [t["refId"] for t in p["targets"]]
    assert all(t["instant"] and t["format"] == "table" for t in p["targets"])
    (organize,) = [t["options"] for t in p["transformations"] if t["id"] == "organize"]
    assert ("merge" in [t["id"] for t in p["transformations"]]) == (len(refs) > 1)
    rename, order = organize["renameByName"], organize["indexByName"]
    assert [s["alias"] for s in p["styles"]] == sorted(order, key=order.get)
    units = {o["matcher"]["options"]: o["properties"][0]["value"] for o in p["fieldConfig"]["overrides"]}
    for style in p["styles"]:
        if style["type"] == "number":
            ref = style["pattern"].removeprefix("Value #")
            assert ref in refs
            grafana_name = f"Value #{ref}" if len(refs) > 1 else "Value"
            assert rename[grafana_name] == style["alias"] and units[style["alias"]] == style["unit"]
            assert style["unit"] in gen.CONSOLE_UNITS
        else:
            assert style["type"] == "string" and rename[style["pattern"]] == style["alias"]


@pytest.mark.parametrize("rel", sorted(FILES))
def test_variables_are_what_the_console_reads(rel: str) -> None:
    """The console takes `query` variables (type query, shown only with hide 0) and turns `label_values(S, L)` into
    `count(S) by (L)` with the pattern `label_values\\((.*), (.*)\\)`; Grafana needs them refreshed to fill them."""
    variables = FILES[rel]["templating"]["list"]
    assert variables[0]["name"] == "datasource" and variables[0]["type"] == "datasource"
    query_vars = [v for v in variables if v["type"] == "query"]
    assert query_vars
    for v in query_vars:
        assert v["hide"] == 0 and isinstance(v["query"], str) and v["refresh"] == 2
        m = re.fullmatch(r"label_values\((.*), (.*)\)", v["query"])
        assert m and re.fullmatch(r"[a-z_]+", m.group(2)), v["query"]
        assert metric_names(m.group(1)) <= known_families()
        if v["includeAll"]:
            assert v["allValue"] == ".+"  # what the console substitutes for All, so both read the same
    names = [v["name"] for v in variables]
    for _, expr in queries(FILES[rel]):
        used = set(re.findall(r"\$\{?(\w+)", expr)) - {"__rate_interval", "__interval"}
        assert used <= set(names), expr


def test_the_model_dashboard_has_namespace_and_model_variables() -> None:
    doc = FILES[f"{gen.DASHBOARDS_DIR}/arbiter-model.json"]
    by_name = {v["name"]: v for v in doc["templating"]["list"]}
    assert by_name["namespace"]["query"] == "label_values(arbiter_decisions_total, namespace)"
    # The DecisionModel's name is the pods' target label: the runtime's own `model` label is the served model.
    assert by_name["model"]["query"] == (
        'label_values(arbiter_decisions_total{namespace="$namespace"}, arbiter_dev_decision_model)')


# ------------------------------------------------------------------ the metric interface


def test_metric_names_are_read_as_promql_would() -> None:
    expr = ('histogram_quantile(0.99, sum by (arbiter_dev_version, le) (rate(arbiter_decision_latency_seconds_bucket'
            '{namespace="$namespace", kind=~"a|b"}[$__rate_interval]))) / on (pod) group_left (x) vllm:num_requests_'
            'running{pod="p"} or vector(0) * time() - max(up)')
    assert metric_names(expr) == {"arbiter_decision_latency_seconds_bucket", "vllm:num_requests_running", "up"}


def test_a_misspelled_metric_is_caught() -> None:
    assert metric_names("sum(rate(arbiter_decisons_total[1m]))") - known_families() == {"arbiter_decisons_total"}


@pytest.mark.parametrize("rel", sorted(FILES))
def test_every_metric_a_query_reads_is_a_known_family(rel: str) -> None:
    known = known_families()
    for title, expr in queries(FILES[rel]):
        names = metric_names(expr)
        assert names, f"{title}: {expr} reads no metric"
        assert names <= known, f"{title}: unknown metric(s) {sorted(names - known)} in {expr}"


@pytest.mark.parametrize("rel", sorted(FILES))
def test_series_are_selected_by_the_labels_they_carry(rel: str) -> None:
    """Operator series name their DecisionModel with decisionmodel_namespace/decisionmodel (their `namespace` is the
    operator's, written by the scrape); the predictor pods' series with their target labels."""
    uid = FILES[rel]["uid"]
    for title, expr in queries(FILES[rel]):
        for metric, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
            keys = set(re.findall(r"(\w+)\s*[=!]~?", matchers))
            if metric.startswith("arbiter_decisionmodel_"):
                assert "decisionmodel_namespace" in keys and "namespace" not in keys, (title, expr)
                if uid == "arbiter-model":
                    assert {"decisionmodel"} <= keys, (title, expr)
            elif uid == "arbiter-operator":
                assert keys == {"namespace"} and "$operator_namespace" in matchers, (title, expr)
            elif uid == "arbiter-model":
                assert "namespace" in keys, (title, expr)
                if not metric.startswith("DCGM_"):
                    assert "arbiter_dev_decision_model" in keys, (title, expr)
            # The runtime's `model` label is the served model's name, not the DecisionModel's.
            assert "model" not in keys, (title, expr)


def test_promotion_phases_come_from_the_operator() -> None:
    from arbiter_operator.api.promotion import IN_PROGRESS, PromotionOutcome

    assert gen.IN_PROGRESS_RE.split("|") == list(IN_PROGRESS)
    assert gen.ROLLED_BACK in PromotionOutcome.__args__


# ------------------------------------------------------------------ panel_queries


def test_panel_queries_fill_in_every_variable() -> None:
    got = gen.panel_queries("credit-models", "risk")
    expected = [(d["uid"], title, expr) for d in FILES.values() for title, expr in queries(d)]
    assert [(u, t) for u, t, _ in got] == [(u, t) for u, t, _ in expected]
    for (_, _, filled), (_, _, raw) in zip(got, expected, strict=True):
        assert "$" not in filled, filled
        assert filled == (raw.replace("$namespace", "credit-models").replace("$model", "risk")
                          .replace("$__rate_interval", "1m").replace("$operator_namespace", ".+"))
    fleet = [q for u, _, q in got if u == "arbiter-fleet" and "decisions_total" in q]
    assert fleet and all('namespace=~"credit-models"' in q for q in fleet)
    assert all("[5m]" in q for _, _, q in gen.panel_queries("a", "b", rate_interval="5m") if "rate(" in q)
    assert all('namespace=~"arbiter-system"' in q
               for u, _, q in gen.panel_queries("a", "b", operator_namespace="arbiter-system")
               if u == "arbiter-operator")


def test_event_panels_name_real_panels() -> None:
    titles = {(d["uid"], p["title"]): p for d in FILES.values() for p in panels(d) if p["type"] != "row"}
    assert set(titles) >= gen.EVENT_PANELS
    assert ("arbiter-model", "Gates now") in gen.EVENT_PANELS
    assert ("arbiter-model", "Decisions/s by version") not in gen.EVENT_PANELS


def test_substitute_refuses_a_variable_without_a_value() -> None:
    assert gen.substitute('up{a="$x", b="${y}"}', {"x": "1", "y": "2"}) == 'up{a="1", b="2"}'
    with pytest.raises(KeyError, match=r"\$z"):
        gen.substitute("up{a=\"$z\"}", {})


def test_every_query_is_promql_that_prometheus_parses(tmp_path) -> None:
    """promtool (Prometheus' own parser, from the prometheus package hack/setup.sh installs) checks each query,
    variables filled in, as the expression of a recording rule: no server needed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian's prometheus package: bash hack/setup.sh)")
    got = gen.panel_queries("credit-models", "risk")
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, _, expr) in enumerate(got)]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
