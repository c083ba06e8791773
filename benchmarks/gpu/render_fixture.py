"""Render what the operator and the runtime make of the GPU fixture's DecisionModel, with their own code.

    python3 benchmarks/gpu/render_fixture.py [--out benchmarks/gpu/fixture] [--check]

Writes, for tensor parallel 1 and 2 and each answer format (scored compact, the default; scored lines; generated):
  vllm-args-tp1.json, vllm-args-tp2.json     `vllm serve` arguments (arbiter_operator.render.vllm_args)
  vllm-args-tp1-fp8.json, -fp8-kv.json       the same for a version with quantization: fp8 (and kvCacheDtype: fp8),
  vllm-args-tp1-fp8[-kv]-ngram.json          and with n-gram speculative decoding appended (bench_7b.py's arms; the
                                             operator refuses it in extraArgs: these arms measure why);
  vllm-args-tp1-fp8-<serving>.json           the FP8 version with one serving setting changed (SERVING_ARMS:
                                             API servers, structured-outputs backend, vLLM's performance mode);
  vllm-args-tp2-fp8.json                     FP8 at tensor parallel 2 (scale_gpus.py);
                                             each DecisionModel must pass the operator's own checks
  decision-scored.json, decision-scored-fused.json, decision-scored-lines.json, decision-generated.json
                                             decision.json (arbiter_operator.render.decision_config)
  prompts.json                               the system message the runtime sends per format (arbiter_runtime.decide)
The model is trained on prompts.json (build_model.py runs where the operator's and runtime's dependencies may be
missing); `--check` re-renders and fails if anything drifted, which gpu_check.py does on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "operator", ROOT / "runtime"):
    sys.path.insert(0, str(p))

import underwriting as uw  # noqa: E402

# vLLM's n-gram prompt lookup: up to 2 drafted tokens from a match of 1 or 2 tokens of the prompt.
NGRAM = ('--speculative-config={"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":2,'
         '"prompt_lookup_min":1}')

# bench_7b.py's arms that change one serving setting of the FP8 version: vLLM's API server processes (the bound of
# decisions/s at concurrency 64 with one), the other structured-outputs backend, and vLLM's latency-first CUDA
# graph sizes (a flag without a field: extraArgs).
SERVING_ARMS = {
    "fp8-api4": {"apiServers": 4},
    "fp8-api8": {"apiServers": 8},
    "fp8-guidance": {"structuredOutputsBackend": "guidance"},
    "fp8-interactive": {"extraArgs": ["--performance-mode=interactivity"]},
    # Two or three engines sharing the GPU (their own scheduler process each), with two or four API servers each.
    "fp8-e2": {"engines": 2, "apiServers": 2},
    "fp8-e2-api4": {"engines": 2, "apiServers": 4},
    "fp8-e3": {"engines": 3, "apiServers": 2},
}


def render() -> dict[str, object]:
    from arbiter_operator.api.models import DecisionModel
    from arbiter_operator.plan.validate import spec_problems
    from arbiter_operator.render import render_configmap, vllm_args
    from arbiter_runtime.config import parse_config
    from arbiter_runtime.decide import GeneratedMode, ScoredMode
    from arbiter_runtime.tokens import LabelTokens

    files: dict[str, object] = {}
    for tp in (1, 2):
        dm = DecisionModel.model_validate(uw.decision_model(gpus=tp))
        files[f"vllm-args-tp{tp}.json"] = vllm_args(dm)
    fp8, kv = {"quantization": "fp8"}, {"quantization": "fp8", "kvCacheDtype": "fp8"}
    for name, own in (("fp8", fp8), ("fp8-kv", kv)):
        dm = DecisionModel.model_validate(uw.decision_model(version_vllm=own))
        assert not spec_problems(dm), spec_problems(dm)  # what the operator would refuse is no arm
        args = vllm_args(dm, dm.spec.versions[0])
        files[f"vllm-args-tp1-{name}.json"] = args
        # The n-gram arms show why the operator refuses speculative decoding: it does, so they are the FP8 arms'
        # arguments with the flag appended where extraArgs would have put it.
        dm = DecisionModel.model_validate(uw.decision_model(version_vllm=own, extra_args=[NGRAM]))
        assert any("--speculative-config" in p for p in spec_problems(dm)), spec_problems(dm)
        files[f"vllm-args-tp1-{name}-ngram.json"] = [*args, NGRAM]
    for name, serving in SERVING_ARMS.items():
        dm = DecisionModel.model_validate(uw.decision_model(version_vllm=fp8, serving_vllm=serving))
        assert not spec_problems(dm), spec_problems(dm)
        files[f"vllm-args-tp1-{name}.json"] = vllm_args(dm, dm.spec.versions[0])
    dm = DecisionModel.model_validate(uw.decision_model(gpus=2, version_vllm=fp8))
    files["vllm-args-tp2-fp8.json"] = vllm_args(dm, dm.spec.versions[0])  # scale_gpus.py: TP2 of the FP8 arm
    prompts = {}
    for name, mode, fmt in (("scored", "scored", "compact"), ("scored-fused", "scored", "fused"),
                            ("scored-lines", "scored", "lines"), ("generated", "generated", "compact")):
        dm = DecisionModel.model_validate(uw.decision_model(mode=mode, scored_format=fmt))
        # decision.json exactly as the runtime reads it: the operator's ConfigMap text. Key order matters: the
        # operator (and the apiserver, which hands nested objects back with sorted keys) writes every object's keys
        # sorted, so the schema the runtime puts in the prompt and in the JSON constraint is in that order, and a
        # constrained decoder makes the model write a trajectory's keys in that order.
        cm = render_configmap(dm, dm.spec.versions[0])
        cfg_raw = json.loads(next(iter(cm["data"].values())))
        files[f"decision-{name}.json"] = cfg_raw
        cfg = parse_config(cfg_raw)
        if mode == "scored":
            # Token ids only enter the request body, not the messages; placeholders suffice here.
            pairs = {(c, x): i for i, (c, x) in enumerate((c, x) for c in cfg.reasoning_codes for x in cfg.labels)}
            tokens = LabelTokens({lab: i for i, lab in enumerate(cfg.labels)}, {}, "render_fixture", pair_ids=pairs)
            body = ScoredMode(cfg, tokens).request("{}", 0)
        else:
            body = GeneratedMode(cfg).request("{}", 0)
        msgs = body["messages"]
        assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == "{}", msgs
        prompts[name] = {"system": msgs[0]["content"]}
    files["prompts.json"] = prompts
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "fixture")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = ap.parse_args(argv)
    files = render()
    drift = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = args.out / name
        text = json.dumps(content, indent=2, sort_keys=True) + "\n"
        if args.check:
            if not path.is_file() or path.read_text() != text:
                drift.append(name)
        else:
            path.write_text(text)
    if drift:
        print(f"render_fixture: {drift} differ from what the operator/runtime render now; rerun render_fixture.py "
              "and rebuild the model", file=sys.stderr)
        return 1
    print(f"render_fixture: {'checked' if args.check else 'wrote'} {sorted(files)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
