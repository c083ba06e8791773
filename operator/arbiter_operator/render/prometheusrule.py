"""The PrometheusRule (monitoring.coreos.com/v1) of one DecisionModel: the alerts on what its decision servers say.

Why per model, in the model's namespace, and not one rule in the chart: OpenShift's user-workload monitoring
evaluates a PrometheusRule with its namespace enforced on every query, so only a rule in the model's namespace sees
that model's predictor series. The alerts on the operator and on the models' status (Stalled, not Ready, rollback,
promotion stuck) read the operator's own series and ship in the chart (templates/prometheusrule.yaml).

Each version is judged against what its metadata.sla promises (else the promotion analysis' defaults): the share
of decisions the rules made, rejected model answers per decision, and the latency objective, whose error budget is
the 5% of decisions a p95 lets be slower (burn rates as in Google's SRE workbook, "Alerting on SLOs": 14.4x over
1 h and 5 m pages, 6x over 6 h and 30 m warns). The GPU and KV-cache alerts read the NVIDIA DCGM exporter's and
vLLM's series for the same pods; the API-server alert, the CPU of vLLM's processes that the decision server reports
(runtime vllm_processes.py). docs/operations.md has a section per alert; `runbook_url` points at it.
Rendered where the monitoring.coreos.com API is served, beside the PodMonitor. Pure.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DecisionModel
from ..api.names import PODMONITOR_API, PROMETHEUSRULE_KIND
from ..api.promotion import DEFAULT_MAX_FALLBACK_RATE, DEFAULT_MAX_SCHEMA_VIOLATION_RATE
from .common import metadata

API_VERSION = PODMONITOR_API
KIND = PROMETHEUSRULE_KIND
RUNBOOK_BASE = "https://github.com/arbiter-dev/arbiter/blob/main/docs/operations.md"
# A p95 objective leaves 5% of decisions to be slower: the error budget the burn rates spend.
LATENCY_BUDGET = 0.05
FAST_BURN, SLOW_BURN = 14.4, 6.0
GPU_UNDERUSED_PERCENT = 30  # "GPU utilisation persistently under 30%": what operations watches first
KV_CACHE_SATURATED = 0.9
# Cores one vLLM API server process runs: its event loop is one thread, and at the measured bound it ran 0.99.
PROCESS_SATURATED = 0.9
BY_VERSION = "namespace, arbiter_dev_decision_model, arbiter_dev_version"
BY_POD = f"{BY_VERSION}, pod"


def prometheusrule_name(dm_name: str) -> str:
    return dm_name


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"{RUNBOOK_BASE}#{name.lower()}"},
    }


def _ratio(numerator: str, denominator: str, selector: str, window: str) -> str:
    return (f"sum by ({BY_VERSION}) (rate({numerator}{{{selector}}}[{window}])) / "
            f"sum by ({BY_VERSION}) (rate({denominator}{{{selector}}}[{window}]))")


def _version_alerts(dm: DecisionModel, selector: str) -> list[dict[str, Any]]:
    """The decision-quality alerts: each version compared with the bound its metadata.sla promises, one expression
    (`or` of one comparison per version), so one alert name has one rule."""
    where = "{{ $labels.namespace }}/{{ $labels.arbiter_dev_decision_model }} version {{ $labels.arbiter_dev_version }}"
    fallback, violations = [], []
    for v in dm.spec.versions:
        sla = v.metadata.sla
        sel = f'{selector},arbiter_dev_version="{v.name}"'
        fb = sla.maxFallbackRate if sla.maxFallbackRate is not None else DEFAULT_MAX_FALLBACK_RATE
        sv = (sla.maxSchemaViolationRate if sla.maxSchemaViolationRate is not None
              else DEFAULT_MAX_SCHEMA_VIOLATION_RATE)
        fallback.append(f"({_ratio('arbiter_fallbacks_total', 'arbiter_decisions_total', sel, '10m')} > {fb:g})")
        violations.append(
            f"({_ratio('arbiter_schema_violations_total', 'arbiter_decisions_total', sel, '10m')} > {sv:g})")
    return [
        _alert("ArbiterDecisionFallbackRateHigh", " or ".join(fallback), "10m", "warning",
               f"{where}: the fallback rules decide more than the version promises",
               f"{where}: {{{{ $value | humanizePercentage }}}} of decisions over 10 minutes came from the fallback "
               "rules, more than the version's metadata.sla.maxFallbackRate (default "
               f"{DEFAULT_MAX_FALLBACK_RATE:.0%}). arbiter_fallbacks_total by reason says why."),
        _alert("ArbiterDecisionSchemaViolations", " or ".join(violations), "10m", "warning",
               f"{where}: the model's answers fail the checks",
               f"{where}: {{{{ printf \"%.3f\" $value }}}} rejected model answers per decision over 10 minutes, "
               "more than the version's metadata.sla.maxSchemaViolationRate "
               f"(default {DEFAULT_MAX_SCHEMA_VIOLATION_RATE:g}). "
               "arbiter_schema_violations_total by kind names the check."),
    ]


def _burn(selector: str, long: str, short: str, factor: float) -> str:
    bound = f"{factor * LATENCY_BUDGET:g}"
    return " and ".join(
        f"({_ratio('arbiter_decisions_over_objective_total', 'arbiter_decisions_total', selector, w)}) > {bound}"
        for w in (long, short))


def _serving_alerts(selector: str, namespace: str) -> list[dict[str, Any]]:
    where = "{{ $labels.namespace }}/{{ $labels.arbiter_dev_decision_model }} version {{ $labels.arbiter_dev_version }}"
    pod = f"{where} pod {{{{ $labels.pod }}}}"
    gpu_util = (f"avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{namespace=\"{namespace}\"}}) * on (namespace, pod) "
                f"group_left (arbiter_dev_decision_model, arbiter_dev_version) group by ({BY_POD}) "
                f"(arbiter_upstream_up{{{selector}}})")
    return [
        _alert("ArbiterLatencyBudgetBurnFast", _burn(selector, "1h", "5m", FAST_BURN), "2m", "critical",
               f"{where} spends its latency budget {FAST_BURN:g}x too fast",
               f"{where}: more than {FAST_BURN * LATENCY_BUDGET:.0%} of decisions over the last hour and 5 minutes "
               "were slower than the version's declared p95 (metadata.sla.p95LatencyMs): at this rate a month's "
               "budget is gone in two days."),
        _alert("ArbiterLatencyBudgetBurnSlow", _burn(selector, "6h", "30m", SLOW_BURN), "15m", "warning",
               f"{where} spends its latency budget {SLOW_BURN:g}x too fast",
               f"{where}: more than {SLOW_BURN * LATENCY_BUDGET:.0%} of decisions over the last 6 hours and 30 "
               "minutes were slower than the version's declared p95."),
        _alert("ArbiterUpstreamDown", f"max by ({BY_POD}) (arbiter_upstream_up{{{selector}}}) == 0", "5m",
               "warning", f"{pod}: vLLM does not answer",
               f"{pod}: the decision server's vLLM has not answered its health check for 5 minutes; every "
               "decision of this pod comes from the fallback rules."),
        _alert("ArbiterKVCacheSaturated",
               f"max by ({BY_POD}) (vllm:kv_cache_usage_perc{{{selector}}}) > {KV_CACHE_SATURATED:g}",
               "15m", "warning", f"{pod}: vLLM's KV cache is full",
               f"{pod}: vLLM's KV cache has been over {KV_CACHE_SATURATED:.0%} for 15 minutes: requests queue "
               "and decisions slow down (more replicas, or a smaller max-num-seqs)."),
        _alert("ArbiterVLLMAPIServerSaturated",
               f"max by ({BY_POD}) (rate(arbiter_vllm_process_cpu_seconds_total{{{selector},"
               f'process="api-server"}}[5m])) > {PROCESS_SATURATED:g}', "15m", "warning",
               f"{pod}: a vLLM API server process, not the GPU, bounds its decisions",
               f"{pod}: a vLLM API server process has run {{{{ printf \"%.2f\" $value }}}} cores for 15 minutes: "
               "it runs on one core, so requests wait for it while the GPU has room. Raise "
               "spec.serving.vllm.apiServers (one process per core), or add replicas."),
        _alert("ArbiterVLLMEngineCoreSaturated",
               f"max by ({BY_POD}) (rate(arbiter_vllm_process_cpu_seconds_total{{{selector},"
               f'process="engine-core"}}[5m])) > {PROCESS_SATURATED:g}', "15m", "warning",
               f"{pod}: a vLLM engine core, not the GPU, bounds its decisions",
               f"{pod}: a vLLM engine core process has run {{{{ printf \"%.2f\" $value }}}} cores for 15 minutes: "
               "one per engine, it schedules every step on one core while the GPU has room. Raise "
               "spec.serving.vllm.engines (another engine shares the GPU), or add replicas."),
        _alert("ArbiterGPUUnderused", f"{gpu_util} < {GPU_UNDERUSED_PERCENT}", "1h", "info",
               f"{pod} uses its GPUs under {GPU_UNDERUSED_PERCENT}%",
               f"{pod}: GPU utilisation {{{{ printf \"%.0f\" $value }}}}% for an hour (DCGM_FI_DEV_GPU_UTIL): fewer "
               "replicas or GPUs would serve the same traffic."),
        _alert("ArbiterAuditWriteErrors",
               f"sum by ({BY_VERSION}) (rate(arbiter_audit_write_errors_total{{{selector}}}[10m])) > 0", "10m",
               "critical", f"{where}: audit records are not written",
               f"{where}: an audit sink has been failing for 10 minutes (arbiter_audit_write_errors_total by sink); "
               "records wait in the queue, and a full queue refuses decisions (503)."),
        _alert("ArbiterAuditQueueFull",
               f"sum by ({BY_VERSION}) (rate(arbiter_audit_refused_total{{{selector}}}[5m])) > 0", "5m", "critical",
               f"{where} refuses decisions: its audit queue is full",
               f"{where}: requests are refused with 503 because the audit queue is full (the audit sink is too slow "
               "or failing)."),
    ]


def render_prometheusrule(dm: DecisionModel) -> dict[str, Any]:
    ns, name = dm.metadata.namespace, dm.metadata.name
    selector = f'namespace="{ns}",arbiter_dev_decision_model="{name}"'
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(dm, prometheusrule_name(name), "alerts"),
        "spec": {"groups": [{"name": f"arbiter-decisionmodel-{name}",
                             "rules": [*_version_alerts(dm, selector), *_serving_alerts(selector, ns)]}]},
    }
