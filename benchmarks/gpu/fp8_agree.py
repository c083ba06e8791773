"""Does FP8 decide like bf16? The trained fixture model served both ways, side by side on one GPU.

    python3 benchmarks/gpu/fp8_agree.py up --fixture-dir DIR          # both stacks, one after the other (detached)
    python3 benchmarks/gpu/fp8_agree.py agree --n 1000 --out DIR       # the decisions; stops both stacks

Each stack is what a version's container runs: the runtime's supervisor with the operator's rendered arguments for
the fixture's DecisionModel (fixture/vllm-args-tp1.json, and -fp8.json for a version with quantization: fp8) and the
compact decision.json, on the fixture model (build_model.py). Two things differ from a container, so that both fit
one GPU next to each other: each vLLM gets its own port (8100, 8101; the decision servers 8180, 8181) and 12% of
the GPU's memory, and runs eagerly (--enforce-eager: no CUDA graphs, a start in seconds rather than a minute; the
same for both, so the comparison is FP8 against bf16 alone). They start one after the other: vLLM sizes its KV
cache from the memory it sees, and another server allocating at that moment would be counted against it.

The same applicants (seeded) go through both decision servers; reported: decisions by the model, agreement of FP8
with bf16 (same decision; same trajectory code for code), and each one's agreement with the rule set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
import stack  # noqa: E402
import underwriting as uw  # noqa: E402

ARMS = {"bf16": ("vllm-args-tp1.json", 8100, 8180), "fp8": ("vllm-args-tp1-fp8.json", 8101, 8181)}
SEED = 4243  # other applicants than the benchmark's


def up(fixture_dir: str, timeout: float) -> dict[str, float]:
    cfg = stack.write_config("scored")
    waited = {}
    for arm, (args_file, vllm_port, port) in ARMS.items():
        args = [*stack.with_args(stack.fixture(args_file), model_dir=fixture_dir, port=vllm_port,
                                 gpu_memory_utilization=0.12), "--enforce-eager"]
        name = f"fixture-{arm}"
        t0 = time.time()
        stack.start(name, [sys.executable, "-m", "arbiter_runtime", "supervise", "--config", str(cfg), "--host",
                           "127.0.0.1", "--port", str(port), "--", *args], stack.supervisor_env())
        asyncio.run(stack.wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", timeout, name))
        waited[arm] = round(time.time() - t0, 1)
        print(f"fixture {arm} ready in {waited[arm]}s", flush=True)
    return waited


def down() -> None:
    for arm in ARMS:
        stack.stop_group(f"fixture-{arm}")


def _decisions(run: loadgen.Run) -> dict[int, tuple[str, list[tuple[str, str]]]]:
    """applicant index -> (decision, [(code, label) per step]) for the answers the model gave."""
    out = {}
    for r in run.results:
        body = r.body if isinstance(r.body, dict) else {}
        if r.status == 200 and body.get("source") == "model":
            steps = (body.get("trajectory") or {}).get("steps") or []
            out[r.index] = (body.get("decision"), [(s.get("reasoningCode"), s.get("label")) for s in steps])
    return out


async def agree(n: int) -> dict:
    apps = uw.applicants(n, SEED)
    by_arm, runs = {}, {}
    for arm, (_, _, port) in ARMS.items():
        runs[arm] = await loadgen.closed_loop(f"http://127.0.0.1:{port}/v1/decisions", apps, 32, n=n,
                                              max_seconds=180)
        by_arm[arm] = _decisions(runs[arm])
    result: dict = {}
    for arm, decided in by_arm.items():
        rules = sum(decision == uw.decide(apps[i])[-1].label for i, (decision, _) in decided.items())
        result[arm] = {"decisions": len(runs[arm].results), "by_model": len(decided),
                       "rule_agreement": round(rules / max(len(decided), 1), 4), **runs[arm].stats()}
    both = sorted(set(by_arm["bf16"]) & set(by_arm["fp8"]))
    result["compared"] = len(both)
    result["same_decision"] = round(sum(by_arm["bf16"][i][0] == by_arm["fp8"][i][0] for i in both)
                                    / max(len(both), 1), 4)
    result["same_trajectory"] = round(sum(by_arm["bf16"][i] == by_arm["fp8"][i] for i in both) / max(len(both), 1), 4)
    result["differing"] = [{"applicant": apps[i], "bf16": by_arm["bf16"][i], "fp8": by_arm["fp8"][i]}
                           for i in both if by_arm["bf16"][i][0] != by_arm["fp8"][i][0]][:20]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["up", "agree", "down"])
    ap.add_argument("--fixture-dir")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--wait", type=float, default=300)
    args = ap.parse_args(argv)
    try:
        if args.step == "up":
            up(args.fixture_dir, args.wait)
        elif args.step == "agree":
            result = asyncio.run(agree(args.n))
            if not result["compared"]:
                raise RuntimeError(f"no applicant was decided by the model on both: {json.dumps(result)[:2000]}")
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "agree-fp8.json").write_text(json.dumps(result, indent=2))
            print(json.dumps({k: v for k, v in result.items() if k != "differing"}, indent=1), flush=True)
    except Exception as exc:
        print(f"fp8_agree {args.step} failed: {exc}", flush=True)
        for arm in ARMS:
            print(f"--- fixture-{arm} log\n{stack.tail(f'fixture-{arm}', 40)}", flush=True)
        down()
        return 1
    if args.step in ("agree", "down"):
        down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
