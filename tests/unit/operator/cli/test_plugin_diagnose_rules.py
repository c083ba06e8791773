"""The diagnosis as a pure function: each cause's numbers (as a decision server's and vLLM's pages report them) name
that cause first, with its evidence and fix; the cluster's word (conditions, the operator's reason table, a rolled-back
promotion, pods, Events) ranks above a share of decisions; hostile status shapes never raise."""

from __future__ import annotations

import dataclasses

import pytest
from arbiter_operator.cli.diagnose.command import reason_table
from arbiter_operator.cli.diagnose.evidence import Evidence, VersionMetrics, from_pages, highest_filled, quantile
from arbiter_operator.cli.diagnose.rules import diagnose
from arbiter_runtime.metrics import Metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from support.plannerdrive import candidate_ready, failing_canary, two_versions

OK = {"ok": 1000.0, "low_confidence": 0.0, "fallback": 0.0, "error": 0.0}


def dm(**serving) -> dict:
    body = two_versions()
    body["spec"]["serving"]["vllm"].update(serving)
    body["status"] = {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Promoted", "message": ""},
        {"type": "Serving", "status": "True", "reason": "VersionReady", "message": "Serving 1.0.0 100%"}],
        "promotion": {"phase": "Idle", "stable": "1.0.0"}}
    return body


def verdict(m: VersionMetrics, obj: dict | None = None) -> list[str]:
    ev = Evidence("team", "credit-limit", dm=obj or dm())
    ev.metrics[m.version] = m
    return [f.code for f in diagnose(ev, reason_table()).findings]


def metrics(**kw) -> VersionMetrics:
    base = {"decisions": dict(OK), "upstream_up": 1.0, "vllm_read": True, "waiting": 0.0, "running": 1.0,
            "kv_cache": 0.2, "preemptions": 0.0, "queue_p95_s": 0.01}
    base.update(kw)
    return VersionMetrics("1.0.0", "test", **base)


CAUSES = {
    "UpstreamDown": metrics(upstream_up=0.0, decisions={"fallback": 500.0}, fallbacks={"upstream_down": 500.0}),
    "UpstreamErrors": metrics(decisions={"ok": 700.0, "fallback": 300.0}, fallbacks={"upstream_error": 300.0},
                              upstream_errors={"http_5xx": 300.0}),
    "InputTooLong": metrics(decisions={"ok": 600.0, "fallback": 400.0}, fallbacks={"upstream_error": 400.0},
                            upstream_errors={"context_length": 400.0}),
    "DeadlineExceeded": metrics(decisions={"ok": 800.0, "fallback": 200.0}, fallbacks={"deadline": 200.0},
                                latency_p99_s=0.9),
    "Saturated": metrics(decisions={"ok": 800.0, "fallback": 200.0}, fallbacks={"deadline": 200.0}, waiting=12.0,
                         running=32.0, queue_p95_s=0.7),
    "KvCachePressure": metrics(kv_cache=0.99, preemptions=40.0),
    "SchemaViolations": metrics(decisions={"ok": 500.0, "fallback": 500.0}, fallbacks={"invalid": 500.0},
                                violations={"format": 1500.0}),
    "TruncatedAnswers": metrics(decisions={"ok": 500.0, "fallback": 500.0}, fallbacks={"invalid": 500.0},
                                violations={"length": 1500.0}),
    "LowConfidence": metrics(decisions={"ok": 600.0, "low_confidence": 400.0}),
    "AuditQueueFull": metrics(audit_refused=12.0),
    "APIServerBound": metrics(busiest_cores={"api-server": 0.98, "engine-core": 0.71}),
    "EngineCoreBound": metrics(busiest_cores={"api-server": 0.5, "engine-core": 0.97}),
}


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_each_cause_is_named_first(cause):
    assert verdict(CAUSES[cause])[0] == cause


def test_queueing_explains_the_deadline_misses_in_one_finding():
    codes = verdict(CAUSES["Saturated"])
    assert "DeadlineExceeded" not in codes
    ev = Evidence("team", "credit-limit", dm=dm(maxNumSeqs=32))
    ev.metrics["1.0.0"] = CAUSES["Saturated"]
    top = diagnose(ev, reason_table()).findings[0]
    assert any("missed decision.deadlineMs" in e for e in top.evidence)
    assert "maxNumSeqs (now 32)" in " ".join(top.fix)  # the cache has room: more sequences is the fix


def test_a_full_cache_changes_the_saturation_fix_to_more_gpus():
    ev = Evidence("team", "credit-limit", dm=dm())
    ev.metrics["1.0.0"] = metrics(waiting=5.0, queue_p95_s=0.5, kv_cache=0.97)
    found = {f.code: f for f in diagnose(ev, reason_table()).findings}
    assert "add replicas" in " ".join(found["Saturated"].fix) and "GPUs" in " ".join(found["Saturated"].fix)
    assert "lower spec.serving.vllm.maxNumSeqs" in " ".join(found["KvCachePressure"].fix)


def test_a_busy_api_server_says_which_setting_to_raise():
    ev = Evidence("team", "credit-limit", dm=dm(apiServers=4))
    ev.metrics["1.0.0"] = CAUSES["APIServerBound"]
    d = diagnose(ev, reason_table())
    top = d.findings[0]
    assert (top.code, d.problems) == ("APIServerBound", [])  # decisions are on time: a hint, not a problem
    assert "0.98 cores" in top.verdict and "apiServers (now 4)" in " ".join(top.fix)
    assert "api-server 0.98, engine-core 0.71" in " ".join(top.evidence)
    ev = Evidence("team", "credit-limit", dm=dm(apiServers=16))
    ev.metrics["1.0.0"] = CAUSES["APIServerBound"]
    assert "add replicas" in " ".join(diagnose(ev, reason_table()).findings[0].fix)


def test_a_busy_api_server_with_late_decisions_is_a_problem_and_an_idle_one_is_nothing():
    late = metrics(decisions={"ok": 800.0, "fallback": 200.0}, fallbacks={"deadline": 200.0},
                   busiest_cores={"api-server": 0.99})
    ev = Evidence("team", "credit-limit", dm=dm())
    ev.metrics["1.0.0"] = late
    found = {f.code: f for f in diagnose(ev, reason_table()).problems}
    assert "APIServerBound" in found and "DeadlineExceeded" in found
    assert verdict(metrics(busiest_cores={"api-server": 0.6, "engine-core": 0.8})) == ["NoProblemFound"]


def test_a_busy_engine_core_names_another_engine_and_more_api_servers_are_no_fix():
    """The engine core near a whole core: another engine on the GPU is the fix while the pod has one GPU and
    engines is below its most; else replicas. A hint while decisions are on time, a problem when they are late."""
    busy = metrics(busiest_cores={"api-server": 0.6, "engine-core": 0.99})
    ev = Evidence("team", "credit-limit", dm=dm(engines=2))
    ev.metrics["1.0.0"] = busy
    d = diagnose(ev, reason_table())
    top = d.findings[0]
    assert (top.code, d.problems) == ("EngineCoreBound", [])
    assert "0.99 cores" in top.verdict and "raise spec.serving.vllm.engines (now 2)" in " ".join(top.fix)
    assert "apiServers" not in " ".join(top.fix)
    tensor_parallel = dm()
    tensor_parallel["spec"]["serving"]["gpus"] = 2
    for spec in (dm(engines=8), tensor_parallel):
        ev = Evidence("team", "credit-limit", dm=spec)
        ev.metrics["1.0.0"] = busy
        assert "add replicas" in " ".join(diagnose(ev, reason_table()).findings[0].fix)
    late = metrics(decisions={"ok": 800.0, "fallback": 200.0}, fallbacks={"deadline": 200.0},
                   busiest_cores={"engine-core": 1.01})
    ev = Evidence("team", "credit-limit", dm=dm())
    ev.metrics["1.0.0"] = late
    assert "EngineCoreBound" in {f.code for f in diagnose(ev, reason_table()).problems}


def test_a_healthy_version_has_no_problem():
    assert verdict(metrics()) == ["NoProblemFound"]


def test_what_could_not_be_read_is_reported():
    ev = Evidence("team", "credit-limit", dm=dm(), unreadable=["Events: forbidden"])
    d = diagnose(ev, reason_table())
    assert d.unreadable == ["Events: forbidden"] and not d.problems


def test_a_rolled_back_promotion_names_the_failing_gate_and_the_operator_s_advice():
    d, _ = failing_canary()
    d.reconcile(1)
    ev = Evidence("team", "credit-limit", dm=d.body)
    top = diagnose(ev, reason_table()).findings[0]
    assert top.code == "AnalysisFailed" and top.version == "1.1.0"
    assert any(e.startswith("gate p95LatencyMs: 400") for e in top.evidence)
    assert any("kubectl arbiter retry" in f for f in top.fix)
    assert any("By gate" in f for f in top.fix)  # the row of docs/operations.md


def test_a_rolled_back_candidate_s_own_numbers_explain_the_rollback_below_it():
    d, _ = failing_canary()
    d.reconcile(1)
    ev = Evidence("team", "credit-limit", dm=d.body)
    ev.metrics["1.1.0"] = dataclasses.replace(CAUSES["UpstreamErrors"], version="1.1.0")
    found = diagnose(ev, reason_table()).findings
    assert [f.code for f in found[:2]] == ["AnalysisFailed", "UpstreamErrors"]
    assert found[1].score <= 60 and "takes no traffic now" in found[1].verdict
    assert any("its own numbers: [UpstreamErrors]" in e for e in found[0].evidence)


def test_not_serving_ranks_above_everything_with_the_reason_table_s_fix():
    body = dm()
    body["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "CrashLoopBackOff", "message": "pod x restarted 5 times"},
        {"type": "Serving", "status": "False", "reason": "CrashLoopBackOff", "message": "pod x: OOMKilled"}]
    ev = Evidence("team", "credit-limit", dm=body)
    ev.metrics["1.0.0"] = CAUSES["UpstreamDown"]
    found = diagnose(ev, reason_table()).findings
    assert found[0].code == "CrashLoopBackOff" and found[0].score == 100
    assert "oc logs --previous" in found[0].fix[0]
    assert found[1].code == "UpstreamDown"


def test_a_progressing_promotion_is_a_note_not_a_problem():
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    d.body["status"]["conditions"] = [c for c in d.body["status"]["conditions"] if c["type"] != "Serving"]
    result = diagnose(Evidence("team", "credit-limit", dm=d.body), reason_table())
    assert not result.problems


def test_pods_killed_for_memory_and_warning_events_are_findings():
    ev = Evidence("team", "credit-limit", dm=dm())
    ev.pods = [{"metadata": {"name": "p"}, "status": {"containerStatuses": [
        {"name": "kserve-container", "restartCount": 4, "lastState": {"terminated": {"reason": "OOMKilled",
                                                                                     "exitCode": 137}}}]}}]
    ev.events = [{"type": "Warning", "reason": "FailedScheduling", "message": "0/4 nodes: Insufficient gpu",
                  "involvedObject": {"kind": "Pod", "name": "credit-limit--1-0-0-predictor-x"}}]
    found = {f.code: f for f in diagnose(ev, reason_table()).findings}
    assert next(iter(found)) == "OOMKilled" and found["EventFailedScheduling"].score == 10  # Ready: a note


def test_warning_events_are_problems_while_not_ready_and_lost_write_races_are_none():
    body = dm()
    body["status"]["conditions"][0].update(status="False", reason="NotReady")
    ev = Evidence("team", "credit-limit", dm=body)
    ev.events = [{"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container",
                  "involvedObject": {"kind": "Pod", "name": "credit-limit--1-0-0-predictor-x"}},
                 {"type": "Warning", "reason": "UpdateFailed", "message": 'Operation cannot be fulfilled on x "y": the '
                  "object has been modified; please apply your changes to the latest version and try again",
                  "involvedObject": {"kind": "InferenceService", "name": "credit-limit--1-0-0"}}]
    found = {f.code: f for f in diagnose(ev, reason_table()).findings}
    assert found["EventBackOff"].score >= 20 and "EventUpdateFailed" not in found


def runtime_page(**counts) -> str:
    m = Metrics("credit-limit", "1.0.0", objective_seconds=0.15)
    m.upstream_up.set(1)  # its health check passes
    for _ in range(counts.get("ok", 0)):
        m.decision("ok", "model", 0.05)
    for _ in range(counts.get("fallback", 0)):
        m.decision("fallback", "rules", 0.9)
        m.fallbacks.labels("credit-limit", "1.0.0", "deadline").inc()
    return generate_latest(m.registry).decode()


def test_a_decision_server_s_own_page_is_read_into_the_same_numbers():
    page = runtime_page(ok=80, fallback=20)
    vllm = ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n')
    m = from_pages("1.0.0", "x", page, vllm)
    assert m.decisions["ok"] == 80 and m.fallbacks["deadline"] == 20 and m.total == 100
    assert m.waiting == 3 and m.kv_cache == 0.5 and m.vllm_read
    assert m.latency_p50_s is not None and m.latency_p50_s < 0.1 and m.objective_s == 0.15
    assert verdict(m)[0] == "Saturated"


def test_quantiles_follow_promql():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.9, buckets) == pytest.approx(0.5)
    assert quantile(0.99, buckets) == pytest.approx(0.95)
    assert quantile(0.5, []) is None and highest_filled(buckets) == 0.5


status_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                             lambda inner: st.lists(inner, max_size=3) |
                             st.dictionaries(st.sampled_from(["type", "status", "reason", "message", "phase",
                                                              "stable", "candidate", "weight", "checks",
                                                              "lastAnalysis", "failureReason", "conditions",
                                                              "promotion", "history"]), inner, max_size=4),
                             max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(status=status_values, spec=status_values, page=st.text(max_size=300),
       cores=st.dictionaries(st.text(max_size=12), st.floats(allow_nan=False), max_size=4))
def test_hostile_status_and_pages_never_raise(status, spec, page, cores):
    """Any status, spec and metrics page, and any busiest-process reading a Prometheus may answer (any label, any
    value, infinities included)."""
    body = {"metadata": {"name": "x", "namespace": "y", "generation": 2}, "spec": spec, "status": status}
    ev = Evidence("y", "x", dm=body if isinstance(status, dict) and isinstance(spec, dict) else dm())
    ev.metrics["v"] = from_pages("v", "x", page, page)
    ev.metrics["v"].busiest_cores = cores
    d = diagnose(ev, reason_table())
    assert d.findings and all(isinstance(f.verdict, str) for f in d.findings)


def test_a_slow_version_is_told_the_speed_ups_it_does_not_use_yet():
    body = dm()
    fast = body["spec"]["versions"][1]  # 1.1.0: FP8 weights and the fused format already
    fast["vllm"] = {"quantization": "fp8"}
    fast["decision"] = {"scoredFormat": "fused"}

    def fixes(version: str) -> str:
        ev = Evidence("team", "credit-limit", dm=body)
        ev.metrics[version] = dataclasses.replace(CAUSES["DeadlineExceeded"], version=version)
        found = {f.code: f for f in diagnose(ev, reason_table()).findings}
        return " ".join(found["DeadlineExceeded"].fix)

    slow = fixes("1.0.0")
    assert "vllm.quantization: fp8" in slow and "scoredFormat: fused" in slow and "deadlineMs" in slow
    assert "quantization" not in fixes("1.1.0") and "fused" not in fixes("1.1.0")
    # A version the spec no longer lists: nothing is guessed about it.
    assert "quantization" not in fixes("0.9.0") and "deadlineMs" in fixes("0.9.0")


version_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.just("1.0.0"),
                              lambda inner: st.lists(inner, max_size=3) |
                              st.dictionaries(st.sampled_from(["name", "vllm", "decision", "quantization",
                                                               "scoredFormat", "trajectoryMode"]), inner, max_size=4),
                              max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(versions=version_values, decision=version_values)
def test_hostile_versions_never_break_the_slow_version_s_fixes(versions, decision):
    """Any spec.versions and spec.decision (names, quantization and formats of any type): a late version still gets
    its DeadlineExceeded with the deadline fix, and a speed-up is only named as its one fixed sentence."""
    body = dm()
    body["spec"]["versions"] = versions
    body["spec"]["decision"] = decision
    ev = Evidence("team", "credit-limit", dm=body)
    ev.metrics["1.0.0"] = CAUSES["DeadlineExceeded"]
    found = {f.code: f for f in diagnose(ev, reason_table()).findings}
    fixes = found["DeadlineExceeded"].fix
    assert "raise decision.deadlineMs" in fixes[0] and fixes[-1] == "or serve on more GPUs"
    assert all(any(s in f for s in ("vllm.quantization: fp8", "scoredFormat: fused")) for f in fixes[1:-1])
