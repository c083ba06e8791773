"""`python -m arbiter_devenv.dashboards [--check]`: the three Grafana-format dashboards the chart ships, generated.

One source of truth, two ways OpenShift users find them (helm/arbiter/templates/dashboards.yaml): the console's own
Observe -> Dashboards (a ConfigMap per dashboard in `openshift-config-managed`, label
`console.openshift.io/dashboard: "true"`) and a Grafana that loads ConfigMaps through its sidecar (label
`grafana_dashboard: "1"`). Both read the same JSON files, `helm/arbiter/dashboards/<uid>.json`, written here from
grafana-foundation-sdk's builders; `--check` exits 1 when a committed file differs from what this module makes.

- `arbiter-model`: one DecisionModel (template variables `namespace`, `model`): promotion, decisions, latency, the
  decision mix, schema violations, vLLM, GPUs, the audit trail.
- `arbiter-fleet`: every DecisionModel (optional `namespace`): phases, what needs attention, traffic, GPUs.
- `arbiter-operator`: the operator itself (optional `operator_namespace`): reconciles, work queue, API server
  requests, watches, leader, build, process.

Panel types: only `row`, `graph`, `singlestat` and `table`. The console does not embed Grafana: its dashboards page
(the monitoring plugin's "legacy dashboards") renders a panel only when its type is one of `graph`, `singlestat`,
`gauge`, `table` or `grafana-piechart-panel` (inside `row`s) and silently skips every other type, `timeseries` and
`stat` included. Grafana still opens these types: it migrates `graph` to `timeseries` and `singlestat` to `stat` on
load. So every panel here is a type both render, and the tests hold the set.

The console reads those panel types in Grafana's legacy (pre-schema-16) panel format, which the SDK's models (the
current schema) do not have: the column width `span` (1-12; the SDK's `gridPos` is ignored there), a graph's unit
from `yaxes[0].format`, its `legend.show` and `stack`, a single stat's `format`, `decimals` and `valueName`, a table's
columns from `styles` (it refuses a table without them) and a row's `showTitle`. `LEGACY_KEYS` are exactly those; they
are added to the SDK's JSON from the same specification the SDK's fields come from (a graph's unit goes to both
`fieldConfig.defaults.unit` and `yaxes[0].format`), and Grafana's own migration reads the same keys. Every other key
round-trips through the SDK's types (tests/unit/dashboards). Units stay within what the console formats
(`CONSOLE_UNITS`): percentages are ratios (`percentunit`), rates are plain numbers with "/s" in the title.

Series and labels (docs/operations.md, "Dashboards"): runtime and vLLM series are selected and grouped by the target
labels every predictor pod's series bear (`namespace`, `arbiter_dev_decision_model`, `arbiter_dev_version`, `pod`):
the runtime's own `model` label is the served model's name (`spec.model.name`), not the DecisionModel's, and vLLM's
series have no `model`/`version` labels at all. Operator series name their DecisionModel with
`decisionmodel_namespace` and `decisionmodel` (their `namespace` is the operator's, set by the scrape).

`panel_queries(namespace, model)` gives every panel's PromQL with the template variables filled in, for tests that
run them against a real Prometheus; `EVENT_PANELS` names the panels whose series exist only once something happened
(a promotion running, a rollback, an error, a refusal, a model under its GPU budget).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from arbiter_operator.api.promotion import IN_PROGRESS
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import table as tbl
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from arbiter_devenv.generated import write_or_check
from arbiter_devenv.tools import repo_root

DASHBOARDS_DIR = "helm/arbiter/dashboards"
TAGS = ["arbiter"]
# What the console's dashboards page renders (anything else is skipped there without a word); these use row, graph,
# singlestat and table (tests/unit/dashboards holds both).
CONSOLE_PANEL_TYPES = frozenset({"row", "graph", "singlestat", "gauge", "table", "grafana-piechart-panel"})
# The units the console formats (its formatNumber); any other unit is shown as a plain number there.
CONSOLE_UNITS = frozenset({"short", "s", "ms", "percentunit", "bytes", "Bytes", "bps", "Bps", "pps"})
# Keys of Grafana's legacy panel format that the console reads and the SDK's current schema does not model.
LEGACY_KEYS = frozenset({"span", "yaxes", "legend", "stack", "format", "decimals", "valueName", "styles", "showTitle"})

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "[$__rate_interval]"

# Per model: runtime/vLLM series by target labels, operator series by the DecisionModel's own labels.
RT = 'namespace="$namespace", arbiter_dev_decision_model="$model"'
OP = 'decisionmodel_namespace="$namespace", decisionmodel="$model"'
# Fleet: `namespace` may be All (".+").
RT_ALL = 'namespace=~"$namespace"'
OP_ALL = 'decisionmodel_namespace=~"$namespace"'
DM_KEY = "decisionmodel_namespace, decisionmodel"
# Operator: its own namespace, which may be All.
OWN = 'namespace=~"$operator_namespace"'
IN_PROGRESS_RE = "|".join(IN_PROGRESS)
ROLLED_BACK = "RolledBack"  # api.promotion.PromotionOutcome
GPU_IDLE_BELOW = 0.3  # "GPU utilisation under 30%"


# ------------------------------------------------------------------ panel specifications


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Column:
    """A table column: a label (`source` is the label name) or a query's value (`source` is its refId)."""

    source: str
    header: str
    unit: str | None = None  # set for value columns

    @property
    def is_value(self) -> bool:
        return self.unit is not None


@dataclass
class Panel:
    kind: str  # graph | singlestat | table
    title: str
    description: str
    targets: list[Target]
    unit: str = "short"
    width: int = 12  # of Grafana's 24 columns
    height: int = 8
    stack: bool = False
    columns: list[Column] = field(default_factory=list)
    event: bool = False  # its series exist only once something happened (EVENT_PANELS)


@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Variable:
    name: str
    query: str
    label: str
    include_all: bool = False


@dataclass
class Board:
    uid: str
    title: str
    description: str
    variables: list[Variable]
    rows: list[Row]


def graph(title: str, description: str, *targets: Target, unit: str = "short", width: int = 12,
          stack: bool = False, event: bool = False) -> Panel:
    return Panel("graph", title, description, list(targets), unit=unit, width=width, stack=stack, event=event)


def stat(title: str, description: str, expr: str, unit: str = "short", event: bool = False) -> Panel:
    return Panel("singlestat", title, description, [Target(expr)], unit=unit, width=4, height=4, event=event)


def table(title: str, description: str, targets: Sequence[Target], columns: Sequence[Column], width: int = 12,
          height: int = 8, event: bool = False) -> Panel:
    return Panel("table", title, description, list(targets), width=width, height=height, columns=list(columns),
                 event=event)


def label(name: str, header: str) -> Column:
    return Column(name, header)


def value(ref: str, header: str, unit: str = "short") -> Column:
    return Column(ref, header, unit)


def _quantiles(metric: str, sel: str, by: str, legend: str) -> list[Target]:
    """p50 and p99 of a histogram, per `by`."""
    return [Target(f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}{{{sel}}}{RATE})))",
                   f"p{int(q * 100)} {legend}".strip()) for q in (0.5, 0.99)]


def _share(numerator: str, denominator: str, by: str, extra: str = "") -> str:
    """sum by (by, extra) (rate(numerator)) / sum by (by) (rate(denominator)): the share of the denominator's rate
    each `by` group's numerator is, per `extra` label too (the denominator matched on `by` alone)."""
    num_by = f"{by}, {extra}" if extra else by
    return (f"sum by ({num_by}) (rate({numerator}{RATE})) / on ({by}) group_left () "
            f"sum by ({by}) (rate({denominator}{RATE}))")


def _gpu_util(dcgm: str, pod_sel: str, labels: str) -> str:
    """`dcgm` (an expression of DCGM's per-GPU utilisation, 0-100, labelled namespace and pod) given the predictor
    pods' `labels` through a join on (namespace, pod) with the runtime's `arbiter_upstream_up`, multiplied by 0 plus 1:
    the join, not its value."""
    return (f"{dcgm} * on (namespace, pod) group_left ({labels}) "
            f"(0 * max by (namespace, pod, {labels}) (arbiter_upstream_up{{{pod_sel}}}) + 1)")


V = "arbiter_dev_version"
VERSION_LEGEND = "{{arbiter_dev_version}}"


def model_board() -> Board:
    phase_now = (f"max by (phase, strategy, stable, candidate) ((arbiter_decisionmodel_phase{{{OP}}} == 1) "
                 f"* on ({DM_KEY}) group_left (strategy, stable, candidate) "
                 f"max by ({DM_KEY}, strategy, stable, candidate) (arbiter_decisionmodel_info{{{OP}}}))")
    # Keyed like the bounds (gate, direction), so the table's two queries meet on the same rows.
    gate_value_by_bound = (f"max by (gate, direction) (arbiter_decisionmodel_gate_bound{{{OP}}} * 0 "
                           f"+ on ({DM_KEY}, gate) group_left () "
                           f"max by ({DM_KEY}, gate) (arbiter_decisionmodel_gate_value{{{OP}}}))")
    promotion = Row("Promotion", [
        table("Promotion now", "The promotion's phase, strategy and versions, as the operator last wrote them to the "
              "DecisionModel's status (Idle: nothing to promote).",
              [Target(phase_now)],
              [label("phase", "Phase"), label("strategy", "Strategy"), label("stable", "Stable"),
               label("candidate", "Candidate")], width=8, height=4),
        table("Last analysis", "The verdict of the promotion's last analysis (Pass, Fail, NoData, Inconclusive, "
              "Pending). Empty until a promotion has been analysed.",
              [Target(f"max by (verdict) (arbiter_decisionmodel_analysis{{{OP}}}) == 1")],
              [label("verdict", "Verdict")], width=4, height=4, event=True),
        stat("Canary step", "The canary step whose traffic weight holds now.",
             f"max(arbiter_decisionmodel_promotion_step{{{OP}}})"),
        stat("Promotion running for", "Time since the running promotion started. Empty while none runs.",
             f"time() - max(arbiter_decisionmodel_promotion_started_timestamp_seconds{{{OP}}})", unit="s", event=True),
        stat("GPUs held", "GPUs the model's versions hold now: twice the usual while a candidate runs next to the "
             "stable version.", f"sum(max by (version) (arbiter_decisionmodel_gpus{{{OP}}}))"),
        graph("Traffic split", "Share of the model's traffic each version receives, as the operator set it.",
              Target(f"max by (version) (arbiter_decisionmodel_traffic_weight{{{OP}}}) / 100", "{{version}}"),
              unit="percentunit", stack=True),
        graph("Phase over time", "The promotion phase the operator reported at each point in time.",
              Target(f"max by (phase) (arbiter_decisionmodel_phase{{{OP}}}) == 1", "{{phase}}")),
        table("Gates now", "Each decision gate of the running promotion: the value the last analysis measured and "
              "the bound it must respect. Empty outside a promotion.",
              [Target(gate_value_by_bound),
               Target(f"max by (gate, direction) (arbiter_decisionmodel_gate_bound{{{OP}}})")],
              [label("gate", "Gate"), label("direction", "Bound"), value("A", "Value"), value("B", "Limit")],
              event=True),
        graph("Gate values against their bounds", "Measured gate values and their bounds during a promotion: a value "
              "past its bound fails the analysis and rolls the promotion back. Empty outside a promotion.",
              Target(f"max by (gate) (arbiter_decisionmodel_gate_value{{{OP}}})", "{{gate}}"),
              Target(f"max by (gate, direction) (arbiter_decisionmodel_gate_bound{{{OP}}})",
                     "{{gate}} bound ({{direction}})"), event=True),
    ])
    decisions = Row("Decisions", [
        graph("Decisions/s by version", "Decisions answered per second, per version (every outcome).",
              Target(f"sum by ({V}) (rate(arbiter_decisions_total{{{RT}}}{RATE}))", VERSION_LEGEND)),
        graph("Fallback rate by reason", "Share of each version's decisions handed to the fallback rules, by reason "
              "(upstream_down, upstream_error, deadline, invalid, low_confidence).",
              Target(_share(f"arbiter_fallbacks_total{{{RT}}}", f"arbiter_decisions_total{{{RT}}}", V, "reason"),
                     "{{arbiter_dev_version}}: {{reason}}"), unit="percentunit"),
        graph("Latency p50 / p99 by version", "Request-to-decision latency per version, next to the p95 objective "
              "each version declares.",
              *_quantiles("arbiter_decision_latency_seconds_bucket", RT, V, VERSION_LEGEND),
              Target(f"max by ({V}) (arbiter_decision_latency_objective_seconds{{{RT}}})",
                     "p95 objective {{arbiter_dev_version}}"), unit="s"),
        graph("Decisions over the latency objective", "Share of each version's decisions slower than its declared "
              "p95 latency objective: above 5% the version misses it.",
              Target(_share(f"arbiter_decisions_over_objective_total{{{RT}}}", f"arbiter_decisions_total{{{RT}}}", V),
                     VERSION_LEGEND),
              unit="percentunit"),
        graph("Decision mix by label and version", "Share of each version's answered decisions per final label (the "
              "model's or the rules'): a candidate whose mix drifts from the stable version's decides differently.",
              Target(_share(f"arbiter_decision_labels_total{{{RT}}}", f"arbiter_decision_labels_total{{{RT}}}", V,
                            "label"), "{{arbiter_dev_version}}: {{label}}"), unit="percentunit"),
        graph("Schema violations/s by kind", "Model answers the runtime's checks rejected, per second, by kind "
              "(schema, inconsistent, probabilities, order, length, format, logprobs, json).",
              Target(f"sum by ({V}, kind) (rate(arbiter_schema_violations_total{{{RT}}}{RATE}))",
                     "{{arbiter_dev_version}}: {{kind}}")),
    ])
    gpu = _gpu_util('DCGM_FI_DEV_GPU_UTIL{namespace="$namespace"}', RT, V)
    serving = Row("Upstream, vLLM and GPUs", [
        graph("Upstream up", "1 while the pod's vLLM answers its health check, 0 while it does not.",
              Target(f"min by ({V}, pod) (arbiter_upstream_up{{{RT}}})", "{{arbiter_dev_version}} {{pod}}"), width=8),
        graph("Upstream errors/s by kind", "Failed calls from the runtime to vLLM, per second, by kind (connect, "
              "timeout, http_5xx, http_4xx, context_length: a prompt longer than vLLM's max-model-len, protocol, "
              "too_large).",
              Target(f"sum by ({V}, kind) (rate(arbiter_upstream_errors_total{{{RT}}}{RATE}))",
                     "{{arbiter_dev_version}}: {{kind}}"), width=8),
        graph("vLLM KV-cache use", "Share of vLLM's KV cache in use, per pod: near 100% requests queue for cache.",
              Target(f"max by ({V}, pod) (vllm:kv_cache_usage_perc{{{RT}}})", "{{arbiter_dev_version}} {{pod}}"),
              unit="percentunit", width=8),
        graph("vLLM queue time p50 / p99", "Time requests wait in vLLM's queue before they are scheduled.",
              *_quantiles("vllm:request_queue_time_seconds_bucket", RT, V, VERSION_LEGEND), unit="s", width=8),
        graph("vLLM requests running / waiting", "Requests vLLM is running and requests waiting for a slot.",
              Target(f"sum by ({V}) (vllm:num_requests_running{{{RT}}})", "{{arbiter_dev_version}} running"),
              Target(f"sum by ({V}) (vllm:num_requests_waiting{{{RT}}})", "{{arbiter_dev_version}} waiting"), width=8),
        graph("GPU utilisation by version", "Average GPU utilisation (DCGM) of each version's predictor pods.",
              Target(f"avg by ({V}) ({gpu}) / 100", VERSION_LEGEND), unit="percentunit", width=8),
        graph("vLLM processes: busiest core", "CPU of the busiest vLLM process of each kind (API server, engine "
              "core, worker), in cores: near 1 that process, not the GPU, bounds the pod (raise apiServers for an "
              "API server, add replicas for the engine core).",
              Target(f"max by ({V}, process) (rate(arbiter_vllm_process_cpu_seconds_total{{{RT}}}{RATE}))",
                     "{{arbiter_dev_version}}: {{process}}"), width=8),
    ])
    audit = Row("Audit trail", [
        graph("Audit queue depth", "Audit records reserved or waiting for the writer, per pod.",
              Target(f"max by ({V}, pod) (arbiter_audit_queue_depth{{{RT}}})", "{{arbiter_dev_version}} {{pod}}"),
              width=8),
        graph("Refused: audit queue full (/s)", "Requests refused with 503 because the audit queue was full.",
              Target(f"sum by ({V}) (rate(arbiter_audit_refused_total{{{RT}}}{RATE}))", VERSION_LEGEND), width=8),
        graph("Audit write errors/s by sink", "Audit records a sink failed to take. Empty until one fails.",
              Target(f"sum by ({V}, sink) (rate(arbiter_audit_write_errors_total{{{RT}}}{RATE}))",
                     "{{arbiter_dev_version}}: {{sink}}"), width=8, event=True),
    ])
    return Board(
        "arbiter-model", "Arbiter / DecisionModel",
        "One DecisionModel: its promotion, decisions, latency, decision mix, vLLM, GPUs and audit trail.",
        [Variable("namespace", "label_values(arbiter_decisions_total, namespace)", "Namespace"),
         Variable("model", 'label_values(arbiter_decisions_total{namespace="$namespace"}, arbiter_dev_decision_model)',
                  "DecisionModel")],
        [promotion, decisions, serving, audit])


def fleet_board() -> Board:
    # Counts of DecisionModels in some state are 0, not empty, when none is, but only while the operator reports
    # DecisionModels at all: an operator Prometheus does not scrape must not read as a healthy fleet.
    zero = f"0 * count(arbiter_decisionmodel_info{{{OP_ALL}}})"

    def count_of(selector: str) -> str:
        return f"count(max by ({DM_KEY}) ({selector}) == 1) or {zero}"

    in_progress = f'arbiter_decisionmodel_phase{{{OP_ALL}, phase=~"{IN_PROGRESS_RE}"}}'
    rolled_back_ago = (f"time() - max by ({DM_KEY}) (arbiter_decisionmodel_promotion_last_finished_timestamp_seconds"
                       f'{{{OP_ALL}, outcome="{ROLLED_BACK}"}}) < 86400')
    model_labels = "arbiter_dev_decision_model, arbiter_dev_version"
    gpu = _gpu_util(f"avg_over_time(DCGM_FI_DEV_GPU_UTIL{{{RT_ALL}}}[1h])", RT_ALL, model_labels)
    gpu_hour = f"avg by (namespace, {model_labels}) ({gpu}) / 100 < {GPU_IDLE_BELOW}"
    ns_dm = [label("decisionmodel_namespace", "Namespace"), label("decisionmodel", "DecisionModel")]
    state = Row("Fleet", [
        stat("DecisionModels", "DecisionModels the operator reports on.",
             f"count(max by ({DM_KEY}) (arbiter_decisionmodel_info{{{OP_ALL}}}))"),
        stat("Not Ready", "DecisionModels whose Ready condition is not True.",
             count_of(f'arbiter_decisionmodel_condition{{{OP_ALL}, type="Ready", status!="True"}}')),
        stat("Stalled", "DecisionModels the operator cannot make progress on (Stalled=True): they need a person.",
             count_of(f'arbiter_decisionmodel_condition{{{OP_ALL}, type="Stalled", status="True"}}')),
        stat("Promoting", f"DecisionModels in a promotion phase ({', '.join(IN_PROGRESS)}).",
             count_of(in_progress)),
        stat("Rolled back (24 h)", "DecisionModels whose last rollback finished within 24 hours.",
             f"count({rolled_back_ago}) or {zero}"),
        stat("GPUs held", "GPUs all DecisionModels' versions hold now.",
             f"sum(max by ({DM_KEY}, version) (arbiter_decisionmodel_gpus{{{OP_ALL}}})) or {zero}"),
        graph("DecisionModels by phase", "How many DecisionModels are in each promotion phase.",
              Target(f"count by (phase) (max by ({DM_KEY}, phase) (arbiter_decisionmodel_phase{{{OP_ALL}}}) == 1)",
                     "{{phase}}"), stack=True),
        graph("GPUs held per model and version (top 20)", "GPUs each version holds; a model's count doubles while a "
              "candidate runs next to its stable version and falls back when the promotion ends.",
              Target(f"topk(20, max by ({DM_KEY}, version) (arbiter_decisionmodel_gpus{{{OP_ALL}}}))",
                     "{{decisionmodel_namespace}}/{{decisionmodel}} {{version}}")),
    ])
    attention = Row("Needs attention", [
        table("Not Ready or Stalled", "DecisionModels whose Ready condition is not True or that are Stalled; "
              "`oc describe decisionmodel` gives the reason. Empty while all are Ready.",
              [Target(f"max by ({DM_KEY}, type, status) ("
                      f'arbiter_decisionmodel_condition{{{OP_ALL}, type="Ready", status!="True"}} == 1 or '
                      f'arbiter_decisionmodel_condition{{{OP_ALL}, type="Stalled", status="True"}} == 1)')],
              [*ns_dm, label("type", "Condition"), label("status", "Status")], event=True),
        table("Promotions in progress", "Running promotions, their phase, strategy and versions.",
              [Target(f"max by ({DM_KEY}, phase, strategy, stable, candidate) (({in_progress} == 1) "
                      f"* on ({DM_KEY}) group_left (strategy, stable, candidate) "
                      f"max by ({DM_KEY}, strategy, stable, candidate) (arbiter_decisionmodel_info{{{OP_ALL}}}))")],
              [*ns_dm, label("phase", "Phase"), label("strategy", "Strategy"), label("stable", "Stable"),
               label("candidate", "Candidate")], event=True),
        table("Rolled back in the last 24 h", "DecisionModels whose last promotion rollback finished within 24 hours, "
              "and how long ago.", [Target(rolled_back_ago)], [*ns_dm, value("A", "Finished ago", "s")], event=True),
        table("GPU utilisation under 30% (last hour)", "Versions whose GPUs averaged under 30% utilisation (DCGM) "
              "over the last hour: candidates for fewer replicas or GPUs.", [Target(gpu_hour)],
              [label("namespace", "Namespace"), label("arbiter_dev_decision_model", "DecisionModel"),
               label("arbiter_dev_version", "Version"), value("A", "GPU utilisation", "percentunit")], event=True),
    ])
    by_model = "namespace, arbiter_dev_decision_model"
    fallback_share = _share(f"arbiter_fallbacks_total{{{RT_ALL}}}", f"arbiter_decisions_total{{{RT_ALL}}}", by_model)
    traffic = Row("Traffic", [
        graph("Decisions/s per model (top 10)", "The ten busiest DecisionModels, decisions per second.",
              Target(f"topk(10, sum by ({by_model}) (rate(arbiter_decisions_total{{{RT_ALL}}}{RATE})))",
                     "{{namespace}}/{{arbiter_dev_decision_model}}")),
        graph("Fallback rate per model (top 10)", "The ten DecisionModels handing the largest share of their "
              "decisions to the fallback rules.",
              Target(f"topk(10, {fallback_share})", "{{namespace}}/{{arbiter_dev_decision_model}}"),
              unit="percentunit"),
    ])
    return Board(
        "arbiter-fleet", "Arbiter / Fleet",
        "Every DecisionModel: promotion phases, what needs attention, traffic and GPUs.",
        [Variable("namespace", "label_values(arbiter_decisionmodel_info, decisionmodel_namespace)", "Namespace",
                  include_all=True)],
        [state, attention, traffic])


def operator_board() -> Board:
    # process_* are prometheus_client's process collector, exported by every Python service: matched to the
    # operator's own targets through one of its families (same job and instance), multiplied by 1. group_left keeps
    # the process series' labels (pod); a plain one-to-one `on` would keep only job and instance.
    ours = f"on (job, instance) group_left () (0 * arbiter_operator_leader{{{OWN}}} + 1)"
    replicas = Row("Replicas", [
        graph("Leader by replica", "1 for the replica that holds the leader Lease and reconciles, 0 for a standby.",
              Target(f"max by (namespace, pod) (arbiter_operator_leader{{{OWN}}})", "{{namespace}}/{{pod}}"),
              width=8),
        table("Build info", "The operator version and Python each replica runs.",
              [Target(f"max by (namespace, pod, version, python_version) (arbiter_build_info{{{OWN}}})")],
              [label("namespace", "Namespace"), label("pod", "Pod"), label("version", "Version"),
               label("python_version", "Python")], width=8),
        table("Refused objects (last 24 h)", "Objects the operator could not take in, by kind and reason "
              "(Undecodable, InvalidSpec, StatusRefused); each is also logged as a WARNING naming it.",
              [Target(f"sum by (kind, reason) (increase(arbiter_operator_objects_refused_total{{{OWN}}}[24h])) > 0")],
              [label("kind", "Kind"), label("reason", "Reason"), value("A", "Refused")], width=8, event=True),
    ])
    reconcile = Row("Reconcile", [
        graph("Reconciles/s by result", "Reconcile passes per second: converged, requeued (the plan asked to look "
              "again) or error (retried with back-off).",
              Target(f"sum by (result) (rate(arbiter_operator_reconcile_total{{{OWN}}}{RATE}))", "{{result}}"),
              width=8),
        graph("Reconcile duration p50 / p99", "Wall time of one reconcile pass of one DecisionModel.",
              *_quantiles("arbiter_operator_reconcile_duration_seconds_bucket", OWN, "result", "{{result}}"),
              unit="s", width=8),
        graph("Reconcile errors/s by kind", "Failed passes: kube (the API server answered an error) or other.",
              Target(f"sum by (kind) (rate(arbiter_operator_reconcile_errors_total{{{OWN}}}{RATE}))", "{{kind}}"),
              width=8, event=True),
        graph("Work-queue depth", "DecisionModels due and waiting for a worker.",
              Target(f"max by (pod) (arbiter_operator_workqueue_depth{{{OWN}}})", "{{pod}}")),
        graph("Work-queue wait p50 / p99", "Time from due to picked up by a worker: a growing tail means too few "
              "workers for the fleet.",
              *_quantiles("arbiter_operator_workqueue_wait_seconds_bucket", OWN, "pod", "{{pod}}"), unit="s"),
    ])
    api = Row("Kubernetes API and watches", [
        graph("API server requests/s by verb and code", "Requests the operator made to the Kubernetes API, by HTTP "
              "verb and response class (error: no answer).",
              Target(f"sum by (verb, code) (rate(arbiter_operator_kube_requests_total{{{OWN}}}{RATE}))",
                     "{{verb}} {{code}}"), width=8),
        graph("Watch events/s by kind", "Events on the operator's watches by kind, and those skipped because they "
              "only echoed the operator's own write.",
              Target(f"sum by (kind) (rate(arbiter_operator_watch_events_total{{{OWN}}}{RATE}))", "{{kind}}"),
              Target(f"sum(rate(arbiter_operator_watch_echoes_skipped_total{{{OWN}}}{RATE}))", "echoes skipped"),
              width=8),
        graph("Watch bytes/s by kind", "Bytes of watch events received, by kind.",
              Target(f"sum by (kind) (rate(arbiter_operator_watch_bytes_total{{{OWN}}}{RATE}))", "{{kind}}"),
              unit="Bps", width=8),
    ])
    process = Row("Process", [
        graph("CPU", "CPU time the operator's process uses, in cores.",
              Target(f"rate(process_cpu_seconds_total{{{OWN}}}{RATE}) * {ours}", "{{pod}}")),
        graph("Resident memory", "The operator process's resident memory (the chart's limit is 512Mi by default).",
              Target(f"process_resident_memory_bytes{{{OWN}}} * {ours}", "{{pod}}"), unit="bytes"),
    ])
    return Board(
        "arbiter-operator", "Arbiter / Operator",
        "The operator: reconciles, work queue, API server requests, watches, leader, build and process.",
        [Variable("operator_namespace", "label_values(arbiter_operator_leader, namespace)", "Operator namespace",
                  include_all=True)],
        [replicas, reconcile, api, process])


BOARDS: tuple[Callable[[], Board], ...] = (model_board, fleet_board, operator_board)


# ------------------------------------------------------------------ the SDK's builders


def _target(t: Target, ref: str, kind: str) -> prom.Dataquery:
    q = prom.Dataquery().expr(t.expr).ref_id(ref)
    if t.legend:  # the console prints a legend format as written: no Grafana-only "__auto"
        q = q.legend_format(t.legend)
    if kind == "table":
        q = q.instant().format(pm.PromQueryFormat.TABLE)
    elif kind == "singlestat":
        q = q.instant()
    return q


def _refs(p: Panel) -> Iterator[tuple[str, Target]]:
    for i, t in enumerate(p.targets):
        yield chr(ord("A") + i), t


def _builder(p: Panel, panel_id: int) -> db.Panel | tbl.Panel:
    b: db.Panel | tbl.Panel
    if p.kind == "table":
        b = tbl.Panel().show_header(True)
        value_field = {c.source: c for c in p.columns if c.is_value}
        if len(p.targets) > 1:
            b = b.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        rename = {c.source: c.header for c in p.columns if not c.is_value}
        exclude = {"Time": True}
        for ref, _ in _refs(p):
            name = f"Value #{ref}" if len(p.targets) > 1 else "Value"
            if ref in value_field:
                rename[name] = value_field[ref].header
            else:
                exclude[name] = True
        order = {c.header: i for i, c in enumerate(p.columns)}
        b = b.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": exclude, "renameByName": rename, "indexByName": order}))
        for c in value_field.values():
            assert c.unit is not None
            b = b.override_by_name(c.header, [dm.DynamicConfigValue(id_val="unit", value=c.unit)])
    else:
        b = db.Panel().type(p.kind).options({}).unit(p.unit)
    b = b.id(panel_id).title(p.title).description(p.description).datasource(DATASOURCE).span(p.width)
    b = b.height(p.height)
    for ref, t in _refs(p):
        b = b.with_target(_target(t, ref, p.kind))
    return b


def _decimals(unit: str) -> int:
    return 2 if unit == "percentunit" else 0


def _legacy(p: Panel) -> dict[str, Any]:
    """The legacy-format keys the console reads (LEGACY_KEYS), from the same specification."""
    out: dict[str, Any] = {"span": max(1, round(p.width / 2))}
    if p.kind == "graph":
        out.update(yaxes=[{"format": p.unit, "show": True}, {"format": "short", "show": False}],
                   legend={"show": True}, stack=p.stack)
    elif p.kind == "singlestat":
        out.update(format=p.unit, decimals=_decimals(p.unit), valueName="current")
    else:
        out["styles"] = [{"pattern": f"Value #{c.source}" if c.is_value else c.source, "alias": c.header,
                          "type": "number" if c.is_value else "string",
                          **({"unit": c.unit, "decimals": _decimals(c.unit)} if c.unit else {})}
                         for c in p.columns]
    return out


def _variable(v: Variable) -> db.QueryVariable:
    q = (db.QueryVariable(v.name).label(v.label).query(v.query).datasource(DATASOURCE)
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    if v.include_all:
        q = q.include_all(True).all_value(".+")
    return q


def board_json(board: Board) -> dict[str, Any]:
    """The dashboard's JSON: the SDK's, plus the legacy keys the console reads."""
    b = (db.Dashboard(board.title).uid(board.uid).description(board.description).tags(TAGS)
         .time("now-3h", "now").refresh("1m").tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .annotations([])
         .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus")))
    for v in board.variables:
        b = b.with_variable(_variable(v))
    legacy: dict[int, dict[str, Any]] = {}
    next_id = 1
    for row in board.rows:
        b = b.with_row(db.Row(row.title).id(next_id))
        legacy[next_id] = {"showTitle": True}
        next_id += 1
        for p in row.panels:
            b = b.with_panel(_builder(p, next_id))
            legacy[next_id] = _legacy(p)
            next_id += 1
    doc: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    for panel in doc["panels"]:
        panel.update(legacy[panel["id"]])
    return doc


def boards() -> list[Board]:
    return [make() for make in BOARDS]


def render() -> dict[str, str]:
    """Relative path -> file content, for every generated file."""
    return {f"{DASHBOARDS_DIR}/{b.uid}.json": json.dumps(board_json(b), indent=2) + "\n" for b in boards()}


# ------------------------------------------------------------------ queries for tests

EVENT_PANELS: frozenset[tuple[str, str]] = frozenset(
    (b.uid, p.title) for b in boards() for row in b.rows for p in row.panels if p.event)

_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with every `$name` / `${name}` replaced; a variable without a value raises KeyError."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(repl, expr)


def panel_queries(namespace: str, model: str, *, rate_interval: str = "1m",
                  operator_namespace: str = ".+") -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every query of every panel, the template variables filled in:
    `$namespace` and `$model` with the given DecisionModel's, `$__rate_interval` / `$__interval` with
    `rate_interval`, the operator dashboard's `$operator_namespace` with `operator_namespace` (".+": all, as the
    dashboard's All). A panel with several queries gives several tuples with the same title."""
    values = {"namespace": namespace, "model": model, "__rate_interval": rate_interval, "__interval": rate_interval,
              "operator_namespace": operator_namespace}
    return [(b.uid, p.title, substitute(t.expr, values))
            for b in boards() for row in b.rows for p in row.panels for t in p.targets]


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs from the sources")
    args = parser.parse_args(argv)
    return write_or_check(render(), args.check, "python -m arbiter_devenv.dashboards", repo_root())


if __name__ == "__main__":
    sys.exit(main())
