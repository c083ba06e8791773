"""A decision on a 7B-class model on one GPU: bf16 against FP8, vLLM alone against through the runtime.

    python3 benchmarks/gpu/bench_7b.py build --tokenizer-dir DIR --out DIR   # the model, on the GPU
    python3 benchmarks/gpu/bench_7b.py start --arm bf16                      # vLLM through the runtime (detached)
    python3 benchmarks/gpu/bench_7b.py bench --arm bf16 --out DIR            # measure the running arm
    python3 benchmarks/gpu/bench_7b.py switch --arm fp8                      # restart as another arm
    python3 benchmarks/gpu/bench_7b.py report --out DIR                      # every arm and the agreement: a table
    python3 benchmarks/gpu/bench_7b.py stop

The model: Gemma-7B-shaped (hidden 3072, 28 layers, 16 heads of 256, MLP 24576, bf16; 8.5B parameters with the
fixture's vocabulary), random weights, built on the GPU from a config, with the GPU fixture's tokenizer (every label
and reasoning code one whole token). Random weights are enough for timing: validity comes from the
structured-outputs constraint. One thing is not random: a fine-tuned model writes each code and label as its one
whole token, but under a regex a random model may as well spell `INCOME_OK` from pieces (`INC`, `OME`, ...), each
piece a forward pass. So one residual direction carries a constant that no layer writes to, larger for the whole
label, code and end-of-sequence tokens, and the final norm keeps it while it damps the rest: among the tokens the
constraint allows, a whole token always wins, as it does for a trained model; which code and which label stays random.
The (code, label) pair tokens of the fused format's tokenizer carry a larger constant still: where they are allowed
(the fused arms), a pair wins over its code; with the plain tokenizer their ids are padding the grammar never allows.

Arms: the operator's rendered `vllm serve` arguments for the fixture's DecisionModel (fixture/vllm-args-tp1*.json,
model at /mnt/models), one vLLM at a time, started through the runtime's real entrypoint (`python -m arbiter_runtime
supervise -- <args>`, what the container runs) with the compact-format decision.json:
  bf16          the checkpoint as it is
  fp8           quantization: fp8 (FP8 weights quantized at load; FP8 compute on Hopper)
  fp8-kv        quantization: fp8 and kvCacheDtype: fp8
  ngram         the better FP8 arm (by p50 at concurrency 1 through the runtime) plus vLLM's n-gram prompt-lookup
                speculative decoding (extraArgs --speculative-config), which vLLM 0.26 runs with structured outputs
                (xgrammar rolls rejected drafts back)
  fp8-api4, fp8-api8, fp8-guidance, fp8-interactive
                the FP8 version with one serving setting changed (render_fixture.SERVING_ARMS): apiServers 4 and 8,
                structuredOutputsBackend guidance, vLLM's interactivity performance mode (device_7b.sh frontend)
  fp8-regex-timeout
                the FP8 arm with vLLM's own per-request regex timeout (VLLM_REGEX_COMPILATION_TIMEOUT_S=5, which the
                runtime's supervisor sets to 0): what that default saves, measured side by side with fp8
  bf16-fused, fp8-fused, fp8-fused-api4
                scoredFormat fused: the same weights with the tokenizer that has each (code, label) pair as one
                token (built beside the model, served from /mnt/models-fused), one forward pass per step

Per arm and concurrency (1 and 64; BENCH_7B_CONCURRENCY), closed loop, the same applicants:
  direct      the runtime's own request body straight to vLLM (vLLM alone), parsed and checked by the runtime's code
  server      the applicant to the decision server's /v1/decisions; the trajectory checked again independently
              (jsonschema against the version's output schema, probabilities summing to 1, steps 1..K)
  direct-eos  (bf16 only) the body with the bound max_tokens the runtime used before it ended generation on the
              last label: the forced end of sequence's cost, measured in the same run
with generated tokens per decision (usage.completion_tokens), vLLM's own counters per cell (vllm_counters.py: tokens
and forward passes per request, finish reasons, inter-token latency, time to first token, speculative acceptance)
and the runtime's own time per decision (its Server-Timing: total less upstream).

Agreement (fp8_agree.py): the trained fixture served bf16 and FP8 side by side, 1,000 decisions through each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "operator", ROOT / "runtime"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import loadgen  # noqa: E402
import proc_cpu  # noqa: E402
import render_fixture  # noqa: E402
import stack  # noqa: E402
import underwriting as uw  # noqa: E402
import vllm_counters  # noqa: E402

ARMS = {"bf16": "vllm-args-tp1.json", "fp8": "vllm-args-tp1-fp8.json", "fp8-kv": "vllm-args-tp1-fp8-kv.json",
        "fp8-ngram": "vllm-args-tp1-fp8-ngram.json", "fp8-kv-ngram": "vllm-args-tp1-fp8-kv-ngram.json",
        # One serving setting of the FP8 version changed (render_fixture.SERVING_ARMS): `device_7b.sh frontend`.
        "fp8-api4": "vllm-args-tp1-fp8-api4.json", "fp8-api8": "vllm-args-tp1-fp8-api8.json",
        "fp8-guidance": "vllm-args-tp1-fp8-guidance.json", "fp8-interactive": "vllm-args-tp1-fp8-interactive.json",
        # The FP8 version with vLLM's own regex timeout (the runtime's supervisor sets it to 0; grammar_setup.py).
        "fp8-regex-timeout": "vllm-args-tp1-fp8.json",
        # scoredFormat fused: the same weights served with the tokenizer that has each (code, label) pair as one
        # token (stack.FUSED_MODEL_DIR), one forward pass per step.
        "bf16-fused": "vllm-args-tp1.json", "fp8-fused": "vllm-args-tp1-fp8.json",
        "fp8-fused-api4": "vllm-args-tp1-fp8-api4.json",
        # Two or three vLLM engines sharing the GPU (spec.serving.vllm.engines), two or four API servers each.
        "fp8-fused-e2": "vllm-args-tp1-fp8-e2.json", "fp8-fused-e2-api4": "vllm-args-tp1-fp8-e2-api4.json",
        "fp8-fused-e3": "vllm-args-tp1-fp8-e3.json"}
# What an arm changes in the container's environment rather than in the rendered arguments.
ARM_ENV = {"fp8-regex-timeout": {"VLLM_REGEX_COMPILATION_TIMEOUT_S": "5"}}
PORT = 8080
CONCURRENCY = tuple(int(c) for c in os.environ.get("BENCH_7B_CONCURRENCY", "1 64").split())
SEED = 4242
C1_REQUESTS = int(os.environ.get("BENCH_7B_C1", "300"))
# Diagnostic paths for the arms BENCH_7B_DIAG names (`all`: every arm): the runtime's body without what costs per
# token, to see where a pass's time goes. They measure vLLM, not decisions: their answers are not judged.
DIAG = os.environ.get("BENCH_7B_DIAG", "").split()
MAX_SECONDS = float(os.environ.get("BENCH_7B_SECONDS", "10"))
GEMMA_7B = dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=16, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=8192, rms_norm_eps=1e-6)


# ---------------------------------------------------------------- build


def build(tokenizer_dir: Path, out: Path, layers: int | None = None) -> dict:
    import torch
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    whole = [tok.convert_tokens_to_ids(t) for t in (*uw.CODES, *uw.LABELS)] + [tok.eos_token_id]
    for name, tid in zip((*uw.CODES, *uw.LABELS), whole, strict=False):
        assert tok.encode(name, add_special_tokens=False) == [tid], f"{name} is not one token"
    # The fused format's tokenizer: the same one with every (code, label) pair added as one token, as fine-tuning
    # for that format adds them. The model's vocabulary covers it; served with the plain tokenizer, the pair rows are
    # padding the grammar never allows (ids past the tokenizer's vocabulary).
    pair_tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    pair_tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in uw.PAIRS])
    pairs = [pair_tok.convert_tokens_to_ids(p) for p in uw.PAIRS]
    for name, tid in zip(uw.PAIRS, pairs, strict=True):
        assert pair_tok.encode(name, add_special_tokens=False) == [tid], f"{name} is not one token"
    shape = dict(GEMMA_7B)
    if layers:
        shape["num_hidden_layers"] = layers
    # Tied embeddings: vLLM's Gemma reads the output head from the embedding table.
    config = GemmaConfig(vocab_size=len(pair_tok), tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **shape)
    t0 = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(7)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = GemmaForCausalLM(config)
    d0 = 0
    with torch.no_grad():
        # The whole-token direction (see the module docstring): every token's embedding carries a constant in
        # residual dimension 0, the whole tokens a larger one; no layer writes to that dimension. The final norm
        # keeps dimension 0 and scales the random rest down to a tenth (Gemma's norm multiplies by 1 + weight), so
        # the output (the tied embedding table) ranks the whole tokens first and leaves a random choice among them.
        emb = model.model.embed_tokens.weight
        emb[:, d0] = 1.0
        emb[whole, d0] = 5.0
        emb[pairs, d0] = 7.0  # a pair outranks its code, as the fused format's fine-tuned model writes it
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d0, :] = 0
            layer.mlp.down_proj.weight[d0, :] = 0
        model.model.norm.weight[:] = -0.9
        model.model.norm.weight[d0] = 0.0
    params = sum(p.numel() for p in model.parameters())
    built_s = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), max_shard_size="4GB")
    for f in tokenizer_dir.iterdir():
        if f.is_file() and not (f.suffix == ".safetensors" or f.name in ("config.json", "generation_config.json",
                                                                           "arbiter-fixture.json",
                                                                           "model.safetensors.index.json")):
            shutil.copy(f, out / f.name)
    fused_dir = out.with_name(out.name + "-fused")  # the same weights (linked), the pair tokenizer
    fused_dir.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.suffix == ".safetensors" or f.name in ("config.json", "generation_config.json",
                                                     "model.safetensors.index.json"):
            (fused_dir / f.name).unlink(missing_ok=True)
            (fused_dir / f.name).symlink_to(f.resolve())
    pair_tok.save_pretrained(str(fused_dir))
    info = {"parameters": params, "config": shape, "vocab": len(pair_tok), "dtype": "bfloat16",
            "build_s": round(built_s, 1), "saved_s": round(time.time() - t0 - built_s, 1), "whole_token_ids": whole,
            "pair_token_ids": pairs, "fused_dir": fused_dir.name,
            "bytes": sum(f.stat().st_size for f in out.iterdir())}
    (out / "arbiter-bench-model.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info), flush=True)
    return info


# ---------------------------------------------------------------- serve


def fused(arm: str) -> bool:
    return "fused" in arm.split("-")


def arm_model_dir(arm: str) -> str:
    return stack.FUSED_MODEL_DIR if fused(arm) else stack.MODEL_DIR


def arm_config(arm: str) -> str:
    """The arm's decision.json (fixture/decision-NAME.json): the fused format's, or the default compact one."""
    return "scored-fused" if fused(arm) else "scored"


def arm_args(arm: str, model_dir: str | None = None) -> list[str]:
    """The operator's rendered arguments of an arm, serving `model_dir` (default: the arm's model directory)."""
    return stack.with_args(stack.fixture(ARMS[arm]), model_dir=model_dir or arm_model_dir(arm))


def start(arm: str) -> None:
    """vLLM through the runtime's entrypoint: the supervisor runs `vllm serve` and the decision server (port 8080)
    in one session, so they outlive this command."""
    stack.STATE.mkdir(parents=True, exist_ok=True)
    cfg = stack.write_config(arm_config(arm))
    stack.start("supervisor", [sys.executable, "-m", "arbiter_runtime", "supervise", "--config", str(cfg), "--host",
                               "127.0.0.1", "--port", str(PORT), "--", *arm_args(arm)],
                {**stack.supervisor_env(), **ARM_ENV.get(arm, {}), **engines_env(arm)})
    (stack.STATE / "arm").write_text(arm)


def stop(name: str = "supervisor") -> None:
    stack.stop_group(name)


async def wait(timeout: float, port: int = PORT, process: str = "supervisor") -> float:
    return round(await stack.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout, process), 1)


def resolve_arm(arm: str, out: Path | None) -> str:
    """`ngram`: speculative decoding on the FP8 arm that answered faster through the runtime at concurrency 1."""
    if arm != "ngram":
        return arm
    p50 = {}
    for base in ("fp8", "fp8-kv"):
        try:
            cells = json.loads((out / f"bench-7b-{base}.json").read_text())["cells"] if out else []
        except (OSError, ValueError, KeyError):
            continue
        found = [c["p50_ms"] for c in cells if c["target"] == "server" and c["concurrency"] == 1 and c["p50_ms"]]
        if found:
            p50[base] = found[0]
    best = min(p50, key=lambda b: p50[b]) if p50 else "fp8"
    return f"{best}-ngram"


def engines_env(arm: str) -> dict[str, str]:
    """ARBITER_VLLM_ENGINES as the operator renders it beside the arm's arguments: from the serving setting the
    arm's fixture file was rendered with (render_fixture.SERVING_ARMS), when it asks for more than one engine."""
    serving = render_fixture.SERVING_ARMS.get(ARMS[arm].removeprefix("vllm-args-tp1-").removesuffix(".json"), {})
    engines = serving.get("engines", 1)
    return {"ARBITER_VLLM_ENGINES": str(engines)} if engines > 1 else {}


def engine_urls(arm: str) -> list[str]:
    """The arm's vLLM engines: the rendered port (stack.VLLM_URL) plus each engine's number, as the supervisor
    starts them."""
    engines = int(engines_env(arm).get("ARBITER_VLLM_ENGINES", "1"))
    base, port = stack.VLLM_URL.rsplit(":", 1)
    return [f"{base}:{int(port) + i}" for i in range(engines)]


async def read_counters(arm: str) -> dict[str, float]:
    """vLLM's counters summed over the arm's engines."""
    total: dict[str, float] = {}
    for url in engine_urls(arm):
        for name, value in (await vllm_counters.read(url)).items():
            total[name] = total.get(name, 0.0) + value
    return total


def running_arm() -> str | None:
    try:
        return (stack.STATE / "arm").read_text().strip() if stack.pid("supervisor") else None
    except OSError:
        return None


# ---------------------------------------------------------------- bench


def independent_check(trajectory, schema_validator) -> bool:
    try:
        schema_validator.validate(trajectory)
        steps = trajectory["steps"]
        return ([s["step"] for s in steps] == list(range(1, uw.STEPS + 1))
                and all(abs(sum(s["probabilities"].values()) - 1) < 1e-6 for s in steps)
                and all(s["reasoningCode"] in uw.CODES for s in steps))
    except Exception:
        return False


_TIMING = re.compile(r"(\w+);dur=([0-9.]+)")


async def _requests(model_dir: str, config: str = "scored"):
    """The runtime's own request builder and checker for the fixture's decision.json (fixture/decision-CONFIG.json),
    with label tokens resolved from the model directory as the decision server resolves them."""
    from arbiter_runtime.config import parse_config
    from arbiter_runtime.decide import ScoredMode, canonical_json, derive_seed
    from arbiter_runtime.tokens import TokenizerJsonSource, resolve_for
    from arbiter_runtime.trajectory import TrajectoryChecker

    cfg = parse_config(stack.fixture(f"decision-{config}.json"))
    source = TokenizerJsonSource(model_dir)
    tokens = await resolve_for(source, cfg, source.description)
    mode = ScoredMode(cfg, tokens)
    apps = uw.applicants(int(os.environ.get("BENCH_7B_APPS", "2000")), SEED)
    bodies = []
    for a in apps:
        c = canonical_json(a)
        bodies.append(mode.request(c, derive_seed(cfg, c)))
    return apps, bodies, mode, TrajectoryChecker(cfg), tokens


def _judge(cell: dict, run: loadgen.Run, target: str, load: list, mode, checker, schema) -> None:
    """Validity, tokens per decision and the finish reasons of the answers; the runtime's own time per decision."""
    from arbiter_runtime.trajectory import TrajectoryInvalid

    ok = tokens_used = 0
    own: list[float] = []
    finish: dict[str, int] = {}
    if target in ("direct-nolp", "direct-free"):  # diagnostic: vLLM's speed, not a decision
        used = [(r.body.get("usage") or {}).get("completion_tokens") for r in run.results
                if r.status == 200 and isinstance(r.body, dict)]
        counted = [n for n in used if isinstance(n, int)]
        cell["valid_share"] = None
        cell["tokens_per_decision"] = round(sum(counted) / len(counted), 2) if counted else None
        return
    for r in (r for r in run.results if r.status == 200):
        body = r.body if isinstance(r.body, dict) else {}
        if target.startswith("direct"):
            reason = str(((body.get("choices") or [{}])[0]).get("finish_reason"))
            finish[reason] = finish.get(reason, 0) + 1
            try:
                trajectory = mode.parse(body, load[r.index % len(load)]["max_tokens"])  # what it asked for
                checker.check(trajectory)
            except (TrajectoryInvalid, KeyError, TypeError, ValueError):
                continue
            ok += independent_check(trajectory, schema)
            tokens_used += body["usage"]["completion_tokens"]
        else:
            ok += body.get("source") == "model" and independent_check(body.get("trajectory"), schema)
            parts = dict(_TIMING.findall(r.server_timing or ""))
            if "total" in parts and "upstream" in parts:
                own.append(float(parts["total"]) - float(parts["upstream"]))
    cell["valid_share"] = round(ok / len(run.results), 4) if run.results else 0.0
    if target.startswith("direct"):
        cell["finish_reasons"] = finish
        if ok:
            cell["tokens_per_decision"] = round(tokens_used / ok, 2)
    if own:
        cell["server_own_p50_ms"] = round(loadgen.percentile(own, 50), 3)
        cell["server_own_p99_ms"] = round(loadgen.percentile(own, 99), 3)


async def bench(arm: str, out: Path | None) -> dict:
    """Measure the arm that is running (`start`/`switch`)."""
    import jsonschema

    schema = jsonschema.Draft202012Validator(uw.output_schema())
    apps, bodies, mode, checker, tokens = await _requests(arm_model_dir(arm), arm_config(arm))
    chats = [url + "/v1/chat/completions" for url in engine_urls(arm)]
    chat = chats[0]
    loads = {"direct": (chats, bodies), "server": ([f"http://127.0.0.1:{PORT}/v1/decisions"], apps)}
    if arm == "bf16" and mode.roomy:
        # The bound the runtime asked for before it ended on the last label: the end of sequence is generated too.
        loads["direct-eos"] = ([chat], [dict(b, max_tokens=mode.roomy) for b in bodies])
    if arm in DIAG or "all" in DIAG:
        # Without log-probabilities; then without the regex constraint too (as many tokens, the end of sequence
        # ignored): what each costs per pass.
        plain = [{k: v for k, v in b.items() if k not in ("logprobs", "logprob_token_ids")} for b in bodies]
        loads["direct-nolp"] = (chats, plain)
        loads["direct-free"] = (chats, [dict({k: v for k, v in b.items() if k != "structured_outputs"},
                                            ignore_eos=True) for b in plain])
    # One pass over the prompts warms vLLM's prefix cache for every path alike.
    await loadgen.spread(chats, bodies, 64, n=len(bodies), max_seconds=60)
    cells = []
    for conc in CONCURRENCY:
        for target, (urls, bodies_or_apps) in loads.items():
            await loadgen.spread(urls, bodies_or_apps, conc, n=max(4 * conc, 16), max_seconds=10)  # warm-up
            before = await read_counters(arm)
            cpu_before = proc_cpu.snapshot()
            n = C1_REQUESTS if conc == 1 else 100 * conc
            # Spread over the arm's engines for vLLM alone (each its share of the workers); one URL: one loop.
            run = await loadgen.spread(urls, bodies_or_apps, conc, n=n, max_seconds=MAX_SECONDS)
            cpu = proc_cpu.shares(cpu_before, proc_cpu.snapshot(), run.wall)
            after = await read_counters(arm)
            cell = {"arm": arm, "target": target, "concurrency": conc, **run.stats(),
                    "vllm": vllm_counters.cell(before, after), "cpu_cores": cpu}
            _judge(cell, run, target, bodies_or_apps, mode, checker, schema)
            cells.append(cell)
            print(json.dumps(cell), flush=True)
    result = {"arm": arm, "vllm_args": arm_args(arm), "max_tokens": bodies[0]["max_tokens"],
              "max_tokens_bound": mode.roomy or bodies[0]["max_tokens"],
              "single_token_steps": tokens.single_token_steps, "standin": stack.STANDIN, "cells": cells}
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"bench-7b-{arm}.json").write_text(json.dumps(result, indent=2))
    print(table([result]), flush=True)
    return result


# ---------------------------------------------------------------- report


def busiest(cell: dict) -> str:
    """The process of the cell that ran the most CPU (a single process near 1.0 cores bounds the cell)."""
    cpu = cell.get("cpu_cores") or {}
    if not cpu:
        return ""
    part = max(cpu, key=lambda k: cpu[k]["busiest"])
    return f"{part} {cpu[part]['busiest']}"


def table(results: list[dict]) -> str:
    rows = ["| arm | path | conc. | decisions/s | p50 ms | p99 ms | valid | tokens/decision | forward passes/decision "
            "| vLLM ITL ms | vLLM TTFT ms | runtime own p50 ms | busiest process, cores |", "|---" * 13 + "|"]
    for result in results:
        for c in result["cells"]:
            v = c["vllm"]
            spec = f" (accepted {v['spec_accepted_tokens_per_request']})" if "spec_accepted_tokens_per_request" in v \
                else ""
            valid = "-" if c["valid_share"] is None else f"{c['valid_share']:.1%}"
            rows.append(f"| {c['arm']} | {c['target']} | {c['concurrency']} | {c['decisions_per_s']} | {c['p50_ms']} "
                        f"| {c['p99_ms']} | {valid} | {c.get('tokens_per_decision', '')} | "
                        f"{v.get('forward_passes_per_request', '')}{spec} | {v.get('itl_mean_ms', '')} | "
                        f"{v.get('ttft_mean_ms', '')} | {c.get('server_own_p50_ms', '')} | {busiest(c)} |")
    return "\n".join(rows)


def report(out: Path) -> dict:
    """Every arm measured in `out` and the fixture agreement: one JSON and the table."""
    results = []
    for arm in ARMS:
        path = out / f"bench-7b-{arm}.json"
        if path.is_file():
            results.append(json.loads(path.read_text()))
    agreement = None
    if (out / "agree-fp8.json").is_file():
        agreement = json.loads((out / "agree-fp8.json").read_text())
    summary = {"arms": results, "agreement_fixture": agreement}
    (out / "gpu-7b-results.json").write_text(json.dumps(summary, indent=2))
    text = table(results)
    if agreement:
        text += "\n\n" + agreement_line(agreement)
    (out / "gpu-7b-table.md").write_text(text + "\n")
    print(text, flush=True)
    return summary


def agreement_line(a: dict) -> str:
    return (f"fixture, {a['compared']} decisions: FP8 decided like bf16 {a['same_decision']:.2%} "
            f"(trajectories code for code {a['same_trajectory']:.2%}); agreement with the rules bf16 "
            f"{a['bf16']['rule_agreement']:.2%}, FP8 {a['fp8']['rule_agreement']:.2%}; by the model "
            f"{a['bf16']['by_model']}/{a['bf16']['decisions']} and {a['fp8']['by_model']}/{a['fp8']['decisions']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["build", "start", "switch", "bench", "report", "stop"])
    ap.add_argument("--arm", default="bf16", choices=[*ARMS, "ngram"])
    ap.add_argument("--tokenizer-dir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--layers", type=int, help="fewer layers (a smoke run on a small GPU or CPU)")
    ap.add_argument("--wait", type=float, default=420)
    args = ap.parse_args(argv)
    arm = resolve_arm(args.arm, args.out)
    if args.step == "build":
        build(args.tokenizer_dir, args.out, args.layers)
    elif args.step in ("start", "switch"):
        t0 = time.time()
        if args.step == "switch":
            stop()
        start(arm)
        try:
            asyncio.run(wait(args.wait))
        except Exception as exc:
            print(f"{arm} not ready: {exc}\n--- supervisor log\n{stack.tail('supervisor', 80)}", flush=True)
            return 1
        print(f"{arm}: ready in {time.time() - t0:.0f}s", flush=True)
    elif args.step == "bench":
        running = running_arm()
        if running is None:
            print("no arm is running: run start or switch first", flush=True)
            return 1
        asyncio.run(bench(running, args.out))
    elif args.step == "report":
        report(args.out)
    else:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
