"""vLLM's own counters from its /metrics, read before and after a benchmark cell: tokens and forward passes per
request as vLLM counted them (vLLM 0.26's metric names; the stand-in serves the same families).

Forward passes of a request are the engine steps that produced tokens for it: the first token (one
`vllm:time_to_first_token_seconds` observation) and one `vllm:inter_token_latency_seconds` observation per later
step. Without speculative decoding each step writes one token, so passes = generated tokens; with it a step writes
one token plus the drafts it accepted (`vllm:spec_decode_num_accepted_tokens_total`).
"""

from __future__ import annotations

import re

import loadgen

_SAMPLE = re.compile(r"^(vllm:[A-Za-z0-9_:]+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|[+-]Inf)$")
_REASON = re.compile(r'finished_reason="([a-z_]+)"')


def parse(text: str) -> dict[str, float]:
    """Every vLLM sample, summed over its labels (engines, models); request_success_total also per finish reason
    (`vllm:request_success_total:length`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m.group(3) in ("NaN", "+Inf", "-Inf"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("_bucket"):
            continue
        out[name] = out.get(name, 0.0) + value
        reason = _REASON.search(labels)
        if reason:
            key = f"{name}:{reason.group(1)}"
            out[key] = out.get(key, 0.0) + value
    return out


async def read(base_url: str) -> dict[str, float]:
    status, text = await loadgen.get(base_url + "/metrics", timeout=10)
    return parse(text) if status == 200 and isinstance(text, str) else {}


def cell(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What vLLM counted between two readings, per request where that is the figure."""
    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests = d("vllm:e2e_request_latency_seconds_count")
    out: dict[str, float] = {"requests": requests}
    if requests <= 0:
        return out
    steps = d("vllm:time_to_first_token_seconds_count") + d("vllm:inter_token_latency_seconds_count")
    out["generation_tokens_per_request"] = round(d("vllm:generation_tokens_total") / requests, 3)
    out["forward_passes_per_request"] = round(steps / requests, 3)
    out["prompt_tokens_per_request"] = round(d("vllm:prompt_tokens_total") / requests, 1)
    for reason in ("stop", "length", "abort", "error"):
        n = d(f"vllm:request_success_total:{reason}")
        if n:
            out[f"finished_{reason}"] = n
    for name, short in (("vllm:inter_token_latency_seconds", "itl"), ("vllm:time_to_first_token_seconds", "ttft"),
                        ("vllm:e2e_request_latency_seconds", "e2e"), ("vllm:request_queue_time_seconds", "queue")):
        n = d(name + "_count")
        if n > 0:
            out[f"{short}_mean_ms"] = round(d(name + "_sum") / n * 1000, 3)
    engine_steps = d("vllm:iteration_tokens_total_count")
    if engine_steps > 0:
        out["engine_steps"] = engine_steps
    drafts = d("vllm:spec_decode_num_draft_tokens_total")
    if drafts > 0:
        accepted = d("vllm:spec_decode_num_accepted_tokens_total")
        out["spec_draft_tokens_per_request"] = round(drafts / requests, 3)
        out["spec_accepted_tokens_per_request"] = round(accepted / requests, 3)
        out["spec_acceptance"] = round(accepted / drafts, 4)
    return out
