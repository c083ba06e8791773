"""Why does generated mode fail on the GPU? Send the runtime's generated-mode request for a few applicants straight
to vLLM in three variants and keep the raw answers:
  runtime     the runtime's body as is (structured_outputs json = the version's outputSchema, with numeric ranges)
  no-ranges   the same schema without minimum/maximum (vLLM's xgrammar compiles ranges into the grammar)
  free        no structured_outputs at all (what the model writes unconstrained)
If the no-ranges variant is valid, the generated-mode benchmark is run again with a decision server whose version
outputSchema has no ranges (rendered by the operator's decision_config; the runtime still checks the ranges on
every answer after generation).
    python3 benchmarks/gpu/generated_diag.py --out DIR [--bench]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_bench
import loadgen
import stack
import underwriting as uw
from direct import Modes, chat_url


async def diag(modes: Modes, n: int = 6) -> dict:
    apps = uw.applicants(n, 777)
    out = {}
    for variant in ("runtime", "no-ranges", "free"):
        rows = []
        for a in apps:
            body = copy.deepcopy(modes.body("generated", a))
            if variant == "no-ranges":
                body["structured_outputs"] = {"json": uw.output_schema(bounds=False)}
            elif variant == "free":
                body.pop("structured_outputs", None)
            status, resp, _ = await loadgen.post(chat_url(), body, timeout=60)
            row = {"status": status}
            if status == 200:
                ch = resp["choices"][0]
                ok, why, _ = modes.validate("generated", resp)
                row.update({"finish_reason": ch.get("finish_reason"), "tokens": resp["usage"]["completion_tokens"],
                            "valid": ok, "why": why, "content": (ch["message"].get("content") or "")[:700]})
            else:
                row["body"] = str(resp)[:500]
            rows.append(row)
        out[variant] = {"valid": sum(bool(r.get("valid")) for r in rows), "of": len(rows), "rows": rows}
        print(variant, out[variant]["valid"], "/", len(rows), json.dumps(rows[0])[:900], flush=True)
    return out


def write_no_ranges_config() -> Path:
    from arbiter_operator.api.models import DecisionModel
    from arbiter_operator.render import decision_config

    dm = DecisionModel.model_validate(uw.decision_model(mode="generated", bounds=False))
    path = stack.STATE / "decision-generated-noranges.json"
    path.write_text(json.dumps(decision_config(dm, dm.spec.versions[0])))
    return path


async def main_async(out: Path, bench: bool) -> dict:
    modes = await Modes.create()
    res = {"diag": await diag(modes)}
    if bench == "no-ranges" and res["diag"]["no-ranges"]["valid"] >= res["diag"]["no-ranges"]["of"] - 1:
        import sys as _s

        stack.kill("runtime-generated", 15)
        cfg = write_no_ranges_config()
        stack.start("runtime-generated", [_s.executable, "-m", "arbiter_runtime", "serve", "--config", str(cfg),
                                          "--host", "127.0.0.1", "--port", str(stack.GENERATED_PORT),
                                          "--model-dir", stack.MODEL_DIR])
        await stack.wait_ready(stack.runtime_url("generated") + "/v2/health/ready", 120, "runtime-generated")
        from arbiter_runtime.config import parse_config
        from arbiter_runtime.decide import GeneratedMode
        from arbiter_runtime.trajectory import TrajectoryChecker

        c = parse_config(json.loads(cfg.read_text()))
        modes.cfg["generated"] = c
        modes.mode["generated"] = GeneratedMode(c)
        modes.checker["generated"] = TrajectoryChecker(c)
        res["bench_no_ranges"] = await gpu_bench.bench(1, modes, modes_list=("generated",))
        print(gpu_bench.table([res["bench_no_ranges"]]), flush=True)
    elif bench == "standard":
        from gpu_check import check_generated

        res["generated_check"] = await check_generated(300)
        print(json.dumps(res["generated_check"]), flush=True)
        res["bench"] = await gpu_bench.bench(1, modes, modes_list=("generated",))
        print(gpu_bench.table([res["bench"]]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generated-diag.json").write_text(json.dumps(res, indent=2))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bench", choices=["none", "no-ranges", "standard"], default="none",
                    help="then benchmark generated mode with the no-ranges schema (if valid) or the standard config")
    args = ap.parse_args(argv)
    asyncio.run(main_async(args.out, args.bench))
    return 0


if __name__ == "__main__":
    sys.exit(main())
