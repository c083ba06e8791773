"""The vLLM flags a DecisionModel may not pass in `spec.serving.vllm.extraArgs` (pure): those vLLM 0.26 removed, those
with which it decides wrongly, those the operator renders from typed fields, and the short spellings vLLM reads them
under. The CRD refuses each as vLLM spells it (`flag_rule`, api/serving.py); what CEL cannot see (prefix
abbreviations, `--config FILE`) is plan/vllm_args.py's.
"""

from __future__ import annotations

from pydantic.json_schema import JsonDict  # type: ignore[attr-defined]  # pydantic defines it, exports none

# vLLM 0.26 refuses these flags at start-up. Each entry: flag -> what to write instead (the message the user sees).
REMOVED_VLLM_FLAGS: dict[str, str] = {
    "--swap-space": (
        "--swap-space was removed in vLLM 0.26 (the V1 engine preempts by recomputation); drop it, or offload KV "
        "cache to CPU memory with --kv-offloading-size"
    ),
    "--disable-log-requests": (
        "--disable-log-requests was removed in vLLM 0.26: requests are no longer logged by default; drop it "
        "(--enable-log-requests turns logging on)"
    ),
    "--guided-decoding-backend": (
        "--guided-decoding-backend was removed in vLLM 0.26; set spec.serving.vllm.structuredOutputsBackend "
        "(rendered as --structured-outputs-config.backend)"
    ),
}
# vLLM 0.26 starts with these flags but decides wrongly with them. Each entry: flag -> why, what to do instead.
# Speculative decoding: with the per-token log-probabilities the decision server asks for, vLLM's chat endpoint
# answers 500 for most requests (its logprobs builder indexes past the drafted tokens' entries); measured through
# the runtime on a 7.75B-class model, 5% of decisions came from the model at concurrency 1 and none at 64.
UNSAFE_VLLM_FLAGS: dict[str, str] = {
    "--speculative-config": (
        "--speculative-config (speculative decoding) breaks decisions in vLLM 0.26: with the log-probabilities the "
        "decision server reads, vLLM fails most requests and they fall back to rules; drop it (FP8, "
        "spec.serving.vllm.quantization, is the measured way to a faster decision)"
    ),
}
# Flags the operator renders from typed fields; giving them twice would leave two sources of truth.
MANAGED_VLLM_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "spec.serving.gpus",
    "--pipeline-parallel-size": "spec.serving.nodes",
    "--max-model-len": "spec.serving.vllm.maxModelLen",
    "--max-num-seqs": "spec.serving.vllm.maxNumSeqs",
    "--block-size": "spec.serving.vllm.blockSize",
    "--gpu-memory-utilization": "spec.serving.vllm.gpuMemoryUtilization",
    "--dtype": "spec.serving.vllm.dtype",
    "--quantization": "spec.serving.vllm.quantization (or a version's vllm.quantization)",
    "--kv-cache-dtype": "spec.serving.vllm.kvCacheDtype (or a version's vllm.kvCacheDtype)",
    "--seed": "spec.serving.vllm.seed",
    "--structured-outputs-config": "spec.serving.vllm.structuredOutputsBackend",
    "--api-server-count": "spec.serving.vllm.apiServers",
    "--port": "the runtime contract (vLLM listens on 8000 inside the pod, behind the decision server)",
    "--served-model-name": "spec.model.name",
}
# vLLM 0.26's short spellings of long flags (EngineArgs.add_cli_args; `-O` is FlexibleArgumentParser's own case).
VLLM_SHORT_ALIASES: dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-q": "--quantization",
    "-O": "--optimization-level",
    "-asc": "--api-server-count",
}


def flag_rule(flag: str, message: str) -> JsonDict:
    """The CRD's CEL rule refusing `flag` in spec.serving.vllm.extraArgs, with `message`."""
    # As vLLM's parser reads them: `--flag`, `--flag=value`, `--flag.key=value`, with `_` for `-` anywhere in the
    # name, and the flag's short aliases. Prefix abbreviations are the operator's check (plan/vllm_args.py).
    n = "a.replace('_', '-')"
    spellings = [f"{n} == '{flag}'", f"{n}.startsWith('{flag}=')", f"{n}.startsWith('{flag}.')"]
    for alias, target in VLLM_SHORT_ALIASES.items():
        if target == flag:
            spellings += [f"a == '{alias}'", f"a.startsWith('{alias}=')"]
    return {"rule": f"!self.exists(a, {' || '.join(spellings)})", "message": message}
