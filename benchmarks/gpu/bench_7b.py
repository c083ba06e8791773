"""Scored-mode decisions on a 7B-class model: the compact answer format against the lines format.

    python3 benchmarks/gpu/bench_7b.py build --tokenizer-dir DIR --out DIR   # the model, on the GPU
    python3 benchmarks/gpu/bench_7b.py start --model-dir DIR                 # vLLM + decision servers (detached)
    python3 benchmarks/gpu/bench_7b.py bench --out DIR                       # the benchmark; prints a table
    python3 benchmarks/gpu/bench_7b.py agree --out DIR     # a trained model: agreement with the rules, both formats
    python3 benchmarks/gpu/bench_7b.py stop

The model: Gemma-7B-shaped (hidden 3072, 28 layers, 16 heads of 256, MLP 24576, bf16; 7.7B parameters), random
weights, built on the GPU from a config, with the GPU fixture's tokenizer (every label and reasoning code one whole
token). Random weights are enough for timing: validity comes from the structured-outputs constraint. One thing is
not random: a fine-tuned model writes each code and label as its one whole token, but under a regex a random model
may as well spell `INCOME_OK` from pieces (`INC`, `OME`, ...), each piece a forward pass. So one residual direction
carries a constant that no layer writes to, larger for the whole label, code and end-of-sequence tokens, and the
final norm keeps it while it damps the rest: among the tokens the constraint allows, a whole token always wins, as
it does for a trained model; which code and which label stays random.

Serving: the operator's rendered `vllm serve` arguments (fixture/vllm-args-tp1.json, model at /mnt/models) started
through the runtime's real entrypoint (`python -m arbiter_runtime supervise -- <args>`, what the container runs)
with the compact-format decision.json (fixture/decision-scored.json); a second decision server (`serve`) with the
lines-format decision.json (fixture/decision-scored-lines.json) in front of the same vLLM.

Benchmark: per format and concurrency (1, 16, 64), closed loop, the same applicants
  direct: the runtime's own request body straight to vLLM, the answer parsed and checked by the runtime's code
  server: the applicant to the decision server's /v1/decisions; the trajectory checked again independently
  (jsonschema against the version's output schema, probabilities summing to 1, steps 1..K)
with generated tokens per decision (usage.completion_tokens of the direct answers) and vLLM's own figures for each
cell from its /metrics (time per output token, time to first token, generation tokens per request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "operator", ROOT / "runtime"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import loadgen  # noqa: E402
import stack  # noqa: E402
import underwriting as uw  # noqa: E402

FORMATS = {"compact": ("scored", 8080), "lines": ("scored-lines", 8081)}
CONCURRENCY = (1, 16, 64)
SEED = 4242
REQUESTS = {1: 300, 16: 2000, 64: 6000}
MAX_SECONDS = float(os.environ.get("BENCH_7B_SECONDS", "10"))
GEMMA_7B = dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=16, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=8192, rms_norm_eps=1e-6)


# ---------------------------------------------------------------- build


def build(tokenizer_dir: Path, out: Path, layers: int | None = None) -> dict:
    import torch
    from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    whole = [tok.convert_tokens_to_ids(t) for t in (*uw.CODES, *uw.LABELS)] + [tok.eos_token_id]
    for name, tid in zip((*uw.CODES, *uw.LABELS), whole, strict=False):
        assert tok.encode(name, add_special_tokens=False) == [tid], f"{name} is not one token"
    shape = dict(GEMMA_7B)
    if layers:
        shape["num_hidden_layers"] = layers
    # Tied embeddings: vLLM's Gemma reads the output head from the embedding table.
    config = GemmaConfig(vocab_size=len(tok), tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
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
    info = {"parameters": params, "config": shape, "vocab": len(tok), "dtype": "bfloat16", "build_s": round(built_s, 1),
            "saved_s": round(time.time() - t0 - built_s, 1), "whole_token_ids": whole,
            "bytes": sum(f.stat().st_size for f in out.iterdir())}
    (out / "arbiter-bench-model.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info), flush=True)
    return info


# ---------------------------------------------------------------- serve


def start(model_dir: str) -> None:
    """vLLM through the runtime's entrypoint (compact decision server on 8080), and the lines decision server on
    8081, each in its own session so they outlive this command."""
    stack.STATE.mkdir(parents=True, exist_ok=True)
    args = stack.vllm_args(1)
    cfg = {name: stack.write_config(fix) for name, (fix, _) in FORMATS.items()}
    stack.start("supervisor", [sys.executable, "-m", "arbiter_runtime", "supervise", "--config", str(cfg["compact"]),
                               "--host", "127.0.0.1", "--port", str(FORMATS["compact"][1]), "--", *args])
    stack.start("runtime-lines", [sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(cfg["lines"]),
                                  "--host", "127.0.0.1", "--port", str(FORMATS["lines"][1]), "--model-dir", model_dir,
                                  "--upstream", stack.VLLM_URL + "/v1"])


def stop() -> None:
    for name in ("runtime-lines", "supervisor"):
        stack.kill(name, signal.SIGTERM, wait=30)
        stack.kill(name, signal.SIGKILL, wait=5)


async def wait(timeout: float) -> float:
    t0 = time.time()
    for name, (_, port) in FORMATS.items():
        process = "supervisor" if name == "compact" else "runtime-lines"
        await stack.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout - (time.time() - t0), process)
    return round(time.time() - t0, 1)


# ---------------------------------------------------------------- bench

_METRIC = re.compile(r"^(vllm:[a-z_]+?)(_sum|_count|_total)?(\{[^}]*\})? ([0-9.eE+-]+|NaN)$")
WATCH = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds", "vllm:time_to_first_token_seconds",
         "vllm:request_generation_tokens", "vllm:e2e_request_latency_seconds", "vllm:request_prefill_time_seconds",
         "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds")


async def vllm_metrics() -> dict[str, float]:
    status, text = await loadgen.get(stack.VLLM_URL + "/metrics", timeout=10)
    out: dict[str, float] = {}
    if status != 200 or not isinstance(text, str):
        return out
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m and m.group(1) in WATCH and m.group(2) in ("_sum", "_count"):
            key = m.group(1) + m.group(2)
            out[key] = out.get(key, 0.0) + float(m.group(4))
    return out


def per_cell(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    out = {}
    for name in WATCH:
        n = after.get(name + "_count", 0) - before.get(name + "_count", 0)
        s = after.get(name + "_sum", 0) - before.get(name + "_sum", 0)
        if n > 0:
            short = name.removeprefix("vllm:").removesuffix("_seconds")
            out[f"{short}_mean" + ("_ms" if name.endswith("_seconds") else "")] = round(
                s / n * (1000 if name.endswith("_seconds") else 1), 3)
    return out


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


async def bench(out: Path | None) -> dict:
    import jsonschema
    from arbiter_runtime.config import parse_config
    from arbiter_runtime.decide import ScoredMode, canonical_json, derive_seed
    from arbiter_runtime.tokens import TokenizerJsonSource, resolve
    from arbiter_runtime.trajectory import TrajectoryChecker, TrajectoryInvalid

    schema = jsonschema.Draft202012Validator(uw.output_schema())
    apps = uw.applicants(int(os.environ.get("BENCH_7B_APPS", "4000")), SEED)
    source = TokenizerJsonSource(stack.MODEL_DIR)
    cells = []
    for fmt, (fix, port) in FORMATS.items():
        cfg = parse_config(stack.fixture(f"decision-{fix}.json"))
        tokens = await resolve(source, cfg.labels, cfg.reasoning_codes, source.description, cfg.label_joiner)
        mode, checker = ScoredMode(cfg, tokens), TrajectoryChecker(cfg)
        bodies = []
        for a in apps:
            c = canonical_json(a)
            bodies.append(mode.request(c, derive_seed(cfg, c)))
        chat = stack.VLLM_URL + "/v1/chat/completions"
        server = f"http://127.0.0.1:{port}/v1/decisions"
        # One pass over the prompts warms vLLM's prefix cache for both paths alike.
        await loadgen.closed_loop(chat, bodies, 64, n=len(bodies), max_seconds=60)
        for conc in CONCURRENCY:
            for target in ("direct", "server"):
                url, load = (chat, bodies) if target == "direct" else (server, apps)
                await loadgen.closed_loop(url, load, conc, n=max(4 * conc, 16), max_seconds=10)  # warm-up
                before = await vllm_metrics()
                run = await loadgen.closed_loop(url, load, conc, n=REQUESTS[conc], max_seconds=MAX_SECONDS)
                after = await vllm_metrics()
                cell = {"format": fmt, "target": target, "concurrency": conc, **run.stats(),
                        "vllm": per_cell(before, after)}
                ok = tokens_used = 0
                own = []
                answered = [r for r in run.results if r.status == 200]
                for r in answered:
                    if target == "direct":
                        try:
                            trajectory = mode.parse(r.body)
                            checker.check(trajectory)
                        except (TrajectoryInvalid, KeyError, TypeError):
                            continue
                        ok += independent_check(trajectory, schema)
                        tokens_used += r.body["usage"]["completion_tokens"]
                    else:
                        body = r.body if isinstance(r.body, dict) else {}
                        ok += body.get("source") == "model" and independent_check(body.get("trajectory"), schema)
                        parts = dict(_TIMING.findall(r.server_timing or ""))
                        if "total" in parts and "upstream" in parts:
                            own.append(float(parts["total"]) - float(parts["upstream"]))
                cell["valid_share"] = round(ok / len(run.results), 4) if run.results else 0.0
                if target == "direct" and ok:
                    cell["tokens_per_decision"] = round(tokens_used / ok, 2)
                if own:
                    cell["server_own_p50_ms"] = round(loadgen.percentile(own, 50), 3)
                    cell["server_own_p99_ms"] = round(loadgen.percentile(own, 99), 3)
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    overhead = {}
    for fmt in FORMATS:
        for conc in CONCURRENCY:
            d, s = (next(c for c in cells if c["format"] == fmt and c["target"] == t and c["concurrency"] == conc)
                    for t in ("direct", "server"))
            if d["p50_ms"] and s["p50_ms"]:
                overhead[f"{fmt}_c{conc}"] = {
                    "p50_ratio": round((s["p50_ms"] - d["p50_ms"]) / d["p50_ms"], 4),
                    "own_share_of_p50": round(s.get("server_own_p50_ms", math.nan) / s["p50_ms"], 4)}
    result = {"cells": cells, "overhead": overhead}
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench-7b.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    return result


async def agree(n: int, out: Path | None) -> dict:
    """The model at /mnt/models (the trained fixture) through both decision servers: agreement with the rules."""
    apps = uw.applicants(n, SEED + 1)
    result = {}
    for fmt, (_, port) in FORMATS.items():
        run = await loadgen.closed_loop(f"http://127.0.0.1:{port}/v1/decisions", apps, 32, n=n, max_seconds=120)
        model = decided = exact = 0
        for r in run.results:
            body = r.body if isinstance(r.body, dict) else {}
            if r.status != 200 or body.get("source") != "model":
                continue
            model += 1
            want = uw.decide(apps[r.index])
            decided += body["decision"] == want[-1].label
            got = [(s["reasoningCode"], s["label"]) for s in body["trajectory"]["steps"]]
            exact += got == [(w.code, w.label) for w in want]
        result[fmt] = {"decisions": len(run.results), "by_model": model, "decision_agreement": decided / max(model, 1),
                       "trajectory_exact": exact / max(model, 1), **run.stats()}
        print(json.dumps({fmt: result[fmt]}), flush=True)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "agree-fixture.json").write_text(json.dumps(result, indent=2))
    return result


def table(result: dict) -> str:
    rows = ["| format | path | conc. | decisions/s | p50 ms | p99 ms | valid | tokens/decision | vLLM ms/token | "
            "vLLM TTFT ms | runtime own p50 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        v = c["vllm"]
        itl = v.get("inter_token_latency_mean_ms", v.get("time_per_output_token_mean_ms", ""))
        rows.append(f"| {c['format']} | {c['target']} | {c['concurrency']} | {c['decisions_per_s']} | {c['p50_ms']} | "
                    f"{c['p99_ms']} | {c['valid_share']:.1%} | {c.get('tokens_per_decision', '')} | {itl} | "
                    f"{v.get('time_to_first_token_mean_ms', '')} | {c.get('server_own_p50_ms', '')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["build", "start", "bench", "agree", "stop"])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--tokenizer-dir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--layers", type=int, help="fewer layers (a smoke run on a small GPU or CPU)")
    ap.add_argument("--model-dir", default=stack.MODEL_DIR)
    ap.add_argument("--wait", type=float, default=420)
    args = ap.parse_args(argv)
    if args.step == "build":
        build(args.tokenizer_dir, args.out, args.layers)
    elif args.step == "start":
        t0 = time.time()
        start(args.model_dir)
        try:
            asyncio.run(wait(args.wait))
        except Exception as exc:
            print(f"not ready: {exc}\n--- supervisor log\n{stack.tail('supervisor', 60)}\n--- lines log\n"
                  f"{stack.tail('runtime-lines', 20)}", flush=True)
            return 1
        print(f"ready in {time.time() - t0:.0f}s", flush=True)
    elif args.step == "bench":
        asyncio.run(bench(args.out))
    elif args.step == "agree":
        asyncio.run(agree(args.n, args.out))
    else:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
