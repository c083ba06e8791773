"""The diagnosis from one version's own numbers (its decision server's and vLLM's): why decisions fall back to the
rules, are cut, are unsure or slow. Pure; rules.py ranks these with what the cluster says.

The runtime decodes at temperature 0 and derives max_tokens from the decision settings, so sampling settings are
never the cause; what is left is vLLM (down, refusing, saturated, out of KV cache, given inputs longer than
maxModelLen), the model (answers that break the constraint, do not stop, are unsure) and the spec's bounds
(deadlineMs, confidenceThreshold).
"""

from __future__ import annotations

from .evidence import VersionMetrics
from .rules import (
    INPUT_NEAR_LIMIT,
    KV_CACHE_FULL,
    LOW_CONFIDENCE_SHARE,
    MAX_API_SERVERS,
    MAX_ENGINES,
    MIN_SHARE,
    PROBLEM_SCORE,
    PROCESS_BOUND,
    Finding,
    Settings,
    _pct,
    _share_score,
    share,
)


def _who(m: VersionMetrics, weight: float | None) -> str:
    return f"version {m.version}" + (f" ({weight:g}% of traffic)" if weight is not None else "")


def _base(m: VersionMetrics) -> list[str]:
    counts = ", ".join(f"{k} {v:g}" for k, v in sorted(m.decisions.items()) if v)
    return [f"{m.source}: {m.total:g} decisions ({counts or 'none'})"]


def _fallbacks(m: VersionMetrics) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(m.fallbacks.items()) if v) or "none"


def metric_findings(m: VersionMetrics, s: Settings, weight: float | None) -> list[Finding]:
    out: list[Finding] = []
    who = _who(m, weight)
    saturated = _saturation(m, s, who)
    out += _upstream(m, s, who)
    out += _deadline(m, s, who, saturated)
    out += saturated
    out += _kv_cache(m, s, who)
    out += _api_server(m, s, who)
    out += _engine_core(m, s, who)
    out += _answers(m, s, who)
    out += _confidence(m, s, who)
    if m.audit_refused:
        out.append(Finding("AuditQueueFull", f"{who}: {m.audit_refused:g} requests refused (503) because the audit "
                           "queue was full", 60, [*_base(m), "arbiter_audit_refused_total > 0"],
                           ["the audit sink is slow or down: the runtime's log names its write errors "
                            "(arbiter_audit_write_errors_total by sink); fix its credentials or reachability"],
                           m.version))
    for f in out:
        f.version = m.version
    return out


def _upstream(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    out: list[Finding] = []
    down = share(m.fallbacks.get("upstream_down", 0.0), m)
    if m.upstream_up == 0 or down >= MIN_SHARE:
        out.append(Finding("UpstreamDown", f"{who}: vLLM is not answering; {_pct(down)} of decisions were made by "
                           "the rules", _share_score(1.0 if m.upstream_up == 0 else down),
                           [*_base(m), f"arbiter_upstream_up {m.upstream_up}", f"fallbacks: {_fallbacks(m)}"],
                           ["vLLM in the predictor pod is down or restarting: `oc logs POD -c kserve-container` "
                            "(crashed, killed for memory, still loading the weights); the rules decide meanwhile"]))
    errors = share(m.fallbacks.get("upstream_error", 0.0), m)
    # vLLM's 400 "maximum context length" (kind context_length); an older runtime counts it as http_4xx, which
    # counts as this cause only when vLLM's prompt sizes come near the limit.
    too_long = m.upstream_errors.get("context_length", 0.0)
    longest = max(m.prompt_tokens_max or 0.0, m.prompt_tokens_p99 or 0.0)
    refused = too_long or (m.upstream_errors.get("http_4xx", 0.0) if longest >= INPUT_NEAR_LIMIT * s.max_model_len
                           else 0.0)
    if refused:
        out.append(Finding("InputTooLong", f"{who}: inputs no longer fit maxModelLen {s.max_model_len}: vLLM refused "
                           f"{refused:g} requests as too long and the rules decided {_pct(errors)} of decisions",
                           _share_score(max(errors, MIN_SHARE)),
                           [*_base(m), f"vLLM's prompt sizes (answered requests): p99 {m.prompt_tokens_p99 or 0:.0f} "
                            f"tokens, the largest at least {m.prompt_tokens_max or 0:.0f}; maxModelLen "
                            f"{s.max_model_len}",
                            f"upstream errors: {_kinds(m.upstream_errors)}"],
                           [f"raise spec.serving.vllm.maxModelLen (now {s.max_model_len}; the ArtifactsValid "
                            "condition says how far the model goes), or bound the inputs (inputSchema maxLength)"]))
    elif errors >= MIN_SHARE:
        kinds = m.upstream_errors
        cause = ("vLLM answers HTTP 5xx (its log says why)" if kinds.get("http_5xx") else
                 "vLLM refuses the requests (HTTP 4xx: served model name, options the model does not support)"
                 if kinds.get("http_4xx") else "calls to vLLM time out or fail")
        out.append(Finding("UpstreamErrors", f"{who}: {_pct(errors)} of decisions fell back to the rules: {cause}",
                           _share_score(errors), [*_base(m), f"upstream errors: {_kinds(kinds)}",
                                                  f"fallbacks: {_fallbacks(m)}"],
                           ["`oc logs POD -c kserve-container` for vLLM's side; the runtime's log names each failed "
                            "call; timeouts: see vLLM's queue (diagnose reports it when it is read)"]))
    return out


def _kinds(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items()) if v) or "none"


def _queue_signal(m: VersionMetrics, s: Settings) -> float:
    """0..1: how much vLLM's queue explains slow decisions (queue time against the deadline, or any waiting)."""
    deadline = (s.deadline_ms or 1000) / 1000
    by_time = min(1.0, (m.queue_p95_s or 0.0) / deadline)
    return max(by_time, 0.5 if (m.waiting or 0) > 0 else 0.0)


def _saturation(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    if not m.vllm_read or ((m.waiting or 0) <= 0 and (m.queue_p95_s or 0) < 0.05):
        return []
    late = share(m.fallbacks.get("deadline", 0.0) + m.upstream_errors.get("timeout", 0.0), m)
    kv = m.kv_cache if m.kv_cache is not None else 0.0
    fix = (f"raise spec.serving.vllm.maxNumSeqs (now {s.max_num_seqs}): the KV cache has room ({_pct(kv)} used)"
           if kv < KV_CACHE_FULL else
           f"add replicas (spec.serving.replicas, now {s.replicas}) or GPUs (spec.serving.gpus, now {s.gpus}): "
           "the KV cache is full too, so more sequences would not fit")
    return [Finding("Saturated", f"{who}: vLLM is saturated, requests wait for a slot (max-num-seqs too low or too "
                    "few GPUs)", _share_score(max(late, _queue_signal(m, s))),
                    [*_base(m), f"vLLM: {m.waiting or 0:g} waiting, {m.running or 0:g} running, queue time p95 "
                     f"{1000 * (m.queue_p95_s or 0):.0f} ms, KV cache {_pct(kv)}; maxNumSeqs {s.max_num_seqs}",
                     f"fallbacks: {_fallbacks(m)}"], [fix])]


def _deadline(m: VersionMetrics, s: Settings, who: str, saturated: list[Finding]) -> list[Finding]:
    late = share(m.fallbacks.get("deadline", 0.0), m)
    if late < MIN_SHARE:
        return []
    if saturated:
        saturated[0].evidence.append(f"{_pct(late)} of decisions missed decision.deadlineMs ({s.deadline_ms} ms) "
                                     "and were made by the rules: the queue explains it")
        return []
    p99 = f"{1000 * m.latency_p99_s:.0f} ms" if m.latency_p99_s is not None else "unknown"
    return [Finding("DeadlineExceeded", f"{who}: {_pct(late)} of decisions took longer than decision.deadlineMs "
                    f"({s.deadline_ms} ms) and were made by the rules", _share_score(late),
                    [*_base(m), f"decision latency p50 {_ms(m.latency_p50_s)}, p99 {p99}",
                     f"vLLM queue: {'not read' if not m.vllm_read else f'{m.waiting or 0:g} waiting'}",
                     f"fallbacks: {_fallbacks(m)}"],
                    _slow_fixes(m, s))]


# What each measured speed-up did for one decision (docs/benchmarks.md: a 7B-class model on one H100, through the
# runtime, p50 at concurrency 1).
SPEEDUPS = {
    "fp8": "serve it in FP8 (a version with vllm.quantization: fp8; measured: each forward pass 35% shorter, a "
           "decision about 20% faster)",
    "fused": "fine-tune it for decision.scoredFormat: fused (each code+label pair one token; measured: one forward "
             "pass per step instead of two, a decision 20-38% faster)",
}


def _slow_fixes(m: VersionMetrics, s: Settings) -> list[str]:
    """The fixes for a version that is slow without a queue: the deadline, what the version does not use yet, GPUs."""
    fixes = ["vLLM answers slowly without queueing: a larger model or longer inputs than the deadline allows; raise "
             f"decision.deadlineMs (now {s.deadline_ms})"]
    fixes += [f"or make each decision faster: {SPEEDUPS[x]}" for x in s.speedups.get(m.version, ())]
    fixes.append("or serve on more GPUs")
    return fixes


def _ms(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{1000 * seconds:.0f} ms"


def _kv_cache(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    kv, preempted = m.kv_cache or 0.0, m.preemptions or 0.0
    if kv < KV_CACHE_FULL and preempted <= 0:
        return []
    return [Finding("KvCachePressure", f"{who}: vLLM's KV cache is {_pct(kv)} full"
                    + (f" and {preempted:g} requests were preempted" if preempted else ""),
                    round(30 + 40 * min(1.0, kv) + (15 if preempted else 0), 1),
                    [*_base(m), f"vllm:kv_cache_usage_perc {kv:.3f}, vllm:num_preemptions_total {preempted:g}, "
                     f"{m.waiting or 0:g} waiting"],
                    [f"lower spec.serving.vllm.maxNumSeqs (now {s.max_num_seqs}) or maxModelLen (now "
                     f"{s.max_model_len}), raise gpuMemoryUtilization (now {s.gpu_memory:g}), or more GPUs "
                     f"(spec.serving.gpus, now {s.gpus}: tensor parallel spreads the cache)"])]


def _process_bound_score(m: VersionMetrics) -> float:
    """A process at its core's end is a problem when decisions miss the deadline or the objective, else a hint: the
    pod has no headroom left."""
    late = share(m.fallbacks.get("deadline", 0.0), m)
    slow = m.objective_s is not None and m.latency_p99_s is not None and m.latency_p99_s > m.objective_s
    return _share_score(late) if late >= MIN_SHARE else (PROBLEM_SCORE if slow else 15)


def _process_evidence(m: VersionMetrics) -> list[str]:
    busiest = ", ".join(f"{k} {v:.2f}" for k, v in sorted(m.busiest_cores.items()))
    return [*_base(m), f"busiest vLLM process of each kind, in cores: {busiest}",
            f"decision latency p50 {_ms(m.latency_p50_s)}, p99 {_ms(m.latency_p99_s)}"]


def _api_server(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    """vLLM's API server (chat template, constraint set-up, log-probabilities, JSON) runs on one core: near a whole
    core it bounds decisions/s while the GPU has room."""
    cores = m.busiest_cores.get("api-server")
    if cores is None or cores < PROCESS_BOUND:
        return []
    fix = (f"raise spec.serving.vllm.apiServers (now {s.api_servers}): one process per core, with "
           "spec.serving.resources.cpu above the processes' sum" if s.api_servers < MAX_API_SERVERS else
           f"add replicas (spec.serving.replicas, now {s.replicas}): apiServers is at its most")
    return [Finding("APIServerBound", f"{who}: a vLLM API server process runs {cores:.2f} cores: it, not the GPU, "
                    "bounds decisions/s", _process_bound_score(m), _process_evidence(m), [fix])]


def _engine_core(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    """vLLM's engine core (the scheduler, the constraint's masks, the model runner's Python) is one process per
    engine: near a whole core it bounds the engine's decisions/s while the GPU waits. Another engine on the same GPU
    brings another core (docs/gpu.md, "Engines sharing a GPU"); more API servers do not."""
    cores = m.busiest_cores.get("engine-core")
    if cores is None or cores < PROCESS_BOUND:
        return []
    if s.gpus == 1 and s.nodes == 1 and s.engines < MAX_ENGINES:
        fix = (f"raise spec.serving.vllm.engines (now {s.engines}): another engine shares the GPU with its own "
               "scheduler process; each needs the weights in its share of gpuMemoryUtilization and its own cores "
               "(spec.serving.resources.cpu above the engines' processes)")
    else:
        fix = f"add replicas (spec.serving.replicas, now {s.replicas}): one engine core per GPU is vLLM's bound here"
    return [Finding("EngineCoreBound", f"{who}: a vLLM engine core runs {cores:.2f} cores: it, not the GPU, bounds "
                    "decisions/s", _process_bound_score(m), _process_evidence(m), [fix])]


def _answers(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    out: list[Finding] = []
    cut = m.violations.get("length", 0.0) + m.finished.get("length", 0.0) * (0 if m.violations else 1)
    broken = {k: v for k, v in m.violations.items() if k != "length" and v}
    invalid = share(m.fallbacks.get("invalid", 0.0), m)
    if cut:
        near = max(m.prompt_tokens_max or 0.0, m.prompt_tokens_p99 or 0.0) >= INPUT_NEAR_LIMIT * s.max_model_len
        out.append(Finding("TruncatedAnswers", f"{who}: answers are cut at max_tokens (finish_reason: length), "
                           f"{cut:g} of them", _share_score(max(share(cut, m), MIN_SHARE)),
                           [*_base(m), f"rejected answers of kind length: {m.violations.get('length', 0):g}; vLLM "
                            f"requests finished by length: {m.finished.get('length', 0):g}"],
                           ["the inputs leave too little of maxModelLen for the answer: raise maxModelLen"
                            if near else "the model does not stop after the last step (not fine-tuned on this "
                            "format): fine-tune it to end there, or check decision.steps and scoredFormat"]))
    if broken or (invalid >= MIN_SHARE and not cut):  # answers cut short are rejected (invalid) too: said above
        per = sum(broken.values()) / m.total if m.total else 0.0
        out.append(Finding("SchemaViolations", f"{who}: the model's answers break the output constraint "
                           f"({per:.2f} rejected answers per decision); {_pct(invalid)} of decisions were made by "
                           "the rules", _share_score(max(invalid, min(1.0, per) / 2)),
                           [*_base(m), f"rejected answers by kind: {_kinds(broken)}", f"fallbacks: {_fallbacks(m)}"],
                           ["vLLM is not applying the structured output (check spec.serving.vllm."
                            "structuredOutputsBackend and the vLLM log), or the version was not fine-tuned for these "
                            "labels, codes and scoredFormat; sampling is not it (the runtime decodes at temperature "
                            "0)"]))
    return out


def _confidence(m: VersionMetrics, s: Settings, who: str) -> list[Finding]:
    unsure = m.fallbacks.get("low_confidence", 0.0) + m.decisions.get("low_confidence", 0.0)
    part = share(unsure, m)
    if part < LOW_CONFIDENCE_SHARE:
        return []
    bound = f" {s.confidence_threshold:g}" if s.confidence_threshold is not None else ""
    return [Finding("LowConfidence", f"{who}: the model is unsure on {_pct(part)} of decisions (confidence under "
                    f"decision.confidenceThreshold{bound})", _share_score(part),
                    [*_base(m), f"low-confidence decisions {unsure:g} (flagged or handed to the rules)"],
                    ["compare confidenceThreshold with the version's calibration (the confidences in its audit "
                     "records); inputs unlike its training data (metadata.trainingData) make it unsure; sampling "
                     "is not it (the runtime decodes at temperature 0)"])]
