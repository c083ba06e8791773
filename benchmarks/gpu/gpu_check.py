"""GPU test script: the decision server in front of a real `vllm serve`, checked end to end.

    python3 benchmarks/gpu/gpu_check.py [--tp 1] [--n 1000] [--out DIR]      # starts and stops its own stack

Starts vLLM with the arguments the operator renders for the fixture's DecisionModel and the decision server
(scored and generated mode, one server each) with the decision.json the operator renders, then checks:
  - fixture drift: the prompts the model was trained on are still what the runtime sends (render_fixture --check)
  - every V2 endpoint answers (live, ready, server and model metadata, model ready, infer with and without the
    version, a batch, 400 on bad input naming the field, 404 on an unknown model), /v1/decisions and /metrics
  - scored mode: N >= 500 decisions, each answered by the model (source: model) with a trajectory that is valid
    against the version's output schema (independent check: jsonschema + probabilities sum to 1 + steps in order),
    and its agreement with the rule set
  - the same input gives the same decision twice (second pass at another concurrency, so batches differ)
  - generated mode: validity and agreement of the model-written trajectories
  - the same validity measured by a direct client against vLLM (the runtime's request builder and parser)
  - fallback: vLLM killed under load -> the rules answer (source: rules), no request fails; vLLM started again
    -> the model answers again (`fallback_handback`, run by device_run.py when it restarts vLLM as TP2)
Results go to stdout (one JSON document) and, with --out, to DIR/check-tpN.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import stack
import underwriting as uw
from direct import Modes, chat_url

CHECK_SEED = 777  # held-out applicants for the GPU checks: neither the training nor the build's held-out stream


def trajectory_problem(traj) -> str | None:
    """Independent validity check of a model trajectory against the fixture's output schema; None when valid."""
    import jsonschema

    schema = uw.output_schema()
    err = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(traj)), None)
    if err is not None:
        return f"schema: {err.message[:160]}"
    for i, step in enumerate(traj["steps"], start=1):
        if step["step"] != i:
            return f"order: position {i} holds step {step['step']}"
        total = sum(step["probabilities"].values())
        if not math.isclose(total, 1.0, abs_tol=1e-3):
            return f"probabilities: step {i} sums to {total}"
    return None


def decision_summary(apps: list[dict], results: list[loadgen.Result]) -> dict:
    n = len(results)
    ok = [r for r in results if r.status == 200 and isinstance(r.body, dict)]
    model = [r for r in ok if r.body.get("source") == "model"]
    problems: dict[str, int] = {}
    valid = 0
    agree = 0
    flagged = 0
    conf = []
    for r in results:
        if r.status != 200 or not isinstance(r.body, dict):
            problems[f"http {r.status}"] = problems.get(f"http {r.status}", 0) + 1
            continue
        if r.body.get("source") != "model":
            key = f"source {r.body.get('source')} ({r.body.get('fallbackReason')})"
            problems[key] = problems.get(key, 0) + 1
            continue
        p = trajectory_problem(r.body.get("trajectory"))
        if p:
            problems[p.split(":")[0]] = problems.get(p.split(":")[0], 0) + 1
            continue
        valid += 1
        agree += r.body["decision"] == uw.decision(apps[r.index % len(apps)])
        flagged += bool(r.body.get("flagged"))
        conf.append(r.body["confidence"])
    conf.sort()
    return {
        "decisions": n,
        "answered_by_model": len(model),
        "valid_trajectories": valid,
        "valid_share": round(valid / n, 4) if n else 0,
        "agreement_with_rules": round(agree / valid, 4) if valid else None,
        "flagged": flagged,
        "confidence_p50": round(conf[len(conf) // 2], 4) if conf else None,
        "confidence_min": round(conf[0], 4) if conf else None,
        "problems": problems,
    }


async def check_endpoints(tp: int) -> dict:
    base = stack.runtime_url("scored")
    name, version = uw.MODEL_NAME, uw.MODEL_VERSION
    app = uw.applicants(3, CHECK_SEED + 1)
    infer_body = {"id": "gpu-check-1", "inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                                   "data": [json.dumps(app[0])]}]}
    batch_body = {"inputs": [{"name": "input", "shape": [3, 1], "datatype": "BYTES",
                              "data": [[json.dumps(a)] for a in app]}]}
    out: dict[str, dict] = {}

    async def rec(key, status, body, want_status, ok_fn=lambda b: True):
        passed = status == want_status and ok_fn(body)
        out[key] = {"status": status, "pass": passed}
        if not passed:
            out[key]["body"] = str(body)[:400]

    for path, fn in [
        ("/v2/health/live", lambda b: b.get("live") is True),
        ("/v2/health/ready", lambda b: b.get("ready") is True),
        ("/v2", lambda b: b.get("name") == "arbiter-runtime"),
        (f"/v2/models/{name}", lambda b: b.get("name") == name and version in b.get("versions", [])),
        (f"/v2/models/{name}/versions/{version}", lambda b: b.get("name") == name),
        (f"/v2/models/{name}/ready", lambda b: b.get("ready") is True),
        (f"/v2/models/{name}/versions/{version}/ready", lambda b: b.get("ready") is True),
    ]:
        status, body = await loadgen.get(base + path)
        await rec(f"GET {path}", status, body, 200, lambda b, fn=fn: isinstance(b, dict) and fn(b))

    def infer_ok(b, rows=1):
        if not isinstance(b, dict):
            return False
        outputs = {o["name"]: o for o in b.get("outputs", [])}
        return (set(outputs) >= {"decision", "confidence", "trajectory", "source"}
                and outputs["confidence"]["datatype"] == "FP32" and len(outputs["decision"]["data"]) == rows
                and all(trajectory_problem(json.loads(t)) is None for t in outputs["trajectory"]["data"])
                and bool(b.get("parameters", {}).get("trace_id")))

    for path in (f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/{version}/infer"):
        status, body, _headers = await loadgen.post(base + path, infer_body)
        await rec(f"POST {path}", status, body, 200, infer_ok)
    status, body, _ = await loadgen.post(base + f"/v2/models/{name}/infer", batch_body)
    await rec(f"POST /v2/models/{name}/infer (3 rows)", status, body, 200, lambda b: infer_ok(b, 3))
    tp_header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    status, body, _headers = await loadgen.post(base + f"/v2/models/{name}/infer", infer_body,
                                               headers={"traceparent": tp_header})
    await rec("POST infer with W3C traceparent", status, body, 200,
              lambda b: b.get("parameters", {}).get("trace_id") == "4bf92f3577b34da6a3ce929d0e0e4736")
    bad = dict(app[0])
    del bad["income"]
    status, body, _ = await loadgen.post(base + f"/v2/models/{name}/infer",
                                         {"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                                      "data": [json.dumps(bad)]}]})
    await rec("POST infer, input without income -> 400 naming the field", status, body, 400,
              lambda b: "income" in json.dumps(b))
    status, body, _ = await loadgen.post(base + "/v2/models/nope/infer", infer_body)
    await rec("POST infer, unknown model -> 404", status, body, 404)
    status, body, _ = await loadgen.post(base + "/v1/decisions", app[0])
    await rec("POST /v1/decisions", status, body, 200,
              lambda b: b.get("source") == "model" and trajectory_problem(b.get("trajectory")) is None)
    status, body = await loadgen.get(base + "/metrics")
    metric_names = sorted({line.split("{")[0].split(" ")[0] for line in str(body).splitlines()
                           if line and not line.startswith("#")})
    await rec("GET /metrics", status, body, 200, lambda b: "arbiter" in str(b))
    out["GET /metrics"]["names"] = [m for m in metric_names if m.startswith("arbiter")][:40]
    return {"all_pass": all(v["pass"] for v in out.values()), "endpoints": out}


async def check_scored(n: int, concurrency: int = 32) -> tuple[dict, list[dict], list[loadgen.Result]]:
    apps = uw.applicants(n, CHECK_SEED)
    run = await loadgen.closed_loop(stack.runtime_url("scored") + "/v1/decisions", apps, concurrency,
                                    max_seconds=240)
    summary = decision_summary(apps, run.results)
    summary.update({"concurrency": concurrency, **{k: v for k, v in run.stats().items() if k.endswith("_ms")}})
    return summary, apps, run.results


async def check_repeat(apps: list[dict], first: list[loadgen.Result], n: int = 200) -> dict:
    """Decide the first n inputs again, one at a time (batches unlike the first pass's 32 in flight)."""
    again = await loadgen.closed_loop(stack.runtime_url("scored") + "/v1/decisions", apps[:n], 1, max_seconds=120)
    same_decision = same_traj = compared = 0
    max_diff = 0.0
    for a, b in zip(first[:n], again.results, strict=False):
        if a.status != 200 or b.status != 200:
            continue
        compared += 1
        same_decision += a.body["decision"] == b.body["decision"]
        same_traj += a.body["trajectory"] == b.body["trajectory"]
        if a.body.get("source") == b.body.get("source") == "model":
            for sa, sb in zip(a.body["trajectory"]["steps"], b.body["trajectory"]["steps"], strict=False):
                for lab in uw.LABELS:
                    max_diff = max(max_diff, abs(sa["probabilities"][lab] - sb["probabilities"][lab]))
    return {"compared": compared, "same_decision": same_decision, "same_trajectory": same_traj,
            "max_probability_difference": max_diff,
            "first_pass_concurrency": 32, "second_pass_concurrency": 1}


async def check_generated(n: int, concurrency: int = 16) -> dict:
    apps = uw.applicants(n, CHECK_SEED + 2)
    run = await loadgen.closed_loop(stack.runtime_url("generated") + "/v1/decisions", apps, concurrency,
                                    max_seconds=180)
    out = decision_summary(apps, run.results)
    out.update({"concurrency": concurrency, **{k: v for k, v in run.stats().items() if k.endswith("_ms")}})
    return out


async def check_direct(modes: Modes, n: int, mode: str = "scored", concurrency: int = 32) -> dict:
    """Validity measured by our own client straight against vLLM (no decision server)."""
    apps = uw.applicants(n, CHECK_SEED)
    bodies = [modes.body(mode, a) for a in apps]
    run = await loadgen.closed_loop(chat_url(), bodies, concurrency, max_seconds=240)
    valid = agree = 0
    problems: dict[str, int] = {}
    tokens = []
    for r in run.results:
        if r.status != 200:
            problems[f"http {r.status}"] = problems.get(f"http {r.status}", 0) + 1
            continue
        ok, why, traj = modes.validate(mode, r.body)
        if not ok:
            key = (why or "").split(":")[0]
            problems[key] = problems.get(key, 0) + 1
            continue
        if trajectory_problem(traj) is not None:
            problems["schema (independent)"] = problems.get("schema (independent)", 0) + 1
            continue
        valid += 1
        agree += modes.decision(mode, traj) == uw.decision(apps[r.index])
        tokens.append(r.body.get("usage", {}).get("completion_tokens"))
    return {"mode": mode, "decisions": len(run.results), "valid": valid,
            "valid_share": round(valid / len(run.results), 4) if run.results else 0,
            "agreement_with_rules": round(agree / valid, 4) if valid else None, "problems": problems,
            "completion_tokens_p50": sorted(t for t in tokens if t is not None)[len(tokens) // 2] if tokens else None,
            "example_request": bodies[0]}


async def fallback_handback(restart, rate: float = 40.0, before_s: float = 5.0, after_s: float = 8.0,
                            restart_timeout: float = 420.0) -> dict:
    """Kill vLLM (SIGKILL, whole process group) under a steady load through the scored decision server, then
    `restart()` it; report what callers saw before, during and after."""
    apps = uw.applicants(500, CHECK_SEED + 3)
    stop = asyncio.Event()
    load = asyncio.create_task(loadgen.open_loop(stack.runtime_url("scored") + "/v1/decisions", apps, rate,
                                                 seconds=restart_timeout + 60, stop=stop))
    await asyncio.sleep(before_s)
    t_kill = time.perf_counter()
    stack.kill("vllm", 9)
    await asyncio.to_thread(wait_gpus_free)
    t_restart = time.perf_counter()
    restart()
    error = None
    try:
        await stack.wait_ready(stack.VLLM_URL + "/health", restart_timeout, "vllm")
    except Exception as exc:
        error = str(exc)[-2000:]
    t_up = time.perf_counter()
    await asyncio.sleep(after_s)
    stop.set()
    run = await load
    phases = {"before_kill": [], "vllm_down": [], "after_vllm_up": []}
    for r in run.results:
        key = "before_kill" if r.started < t_kill else ("vllm_down" if r.started < t_up else "after_vllm_up")
        phases[key].append(r)
    out = {"rate_per_s": rate, "restart_error": error,
           "vllm_down_s": round(t_up - t_kill, 1), "restart_to_healthy_s": round(t_up - t_restart, 1)}
    for key, rs in phases.items():
        sources: dict[str, int] = {}
        wrong = 0
        for r in rs:
            src = r.body.get("source") if r.status == 200 and isinstance(r.body, dict) else f"http {r.status}"
            sources[src] = sources.get(src, 0) + 1
            if r.status == 200 and src == "rules" and r.body["decision"] != uw.decision(apps[r.index % len(apps)]):
                wrong += 1
        lat = sorted(r.latency for r in rs)
        out[key] = {"requests": len(rs), "sources": sources, "rules_decisions_disagreeing_with_rule_set": wrong,
                    "p50_ms": round(loadgen.percentile(lat, 50) * 1000, 1) if lat else None,
                    "max_ms": round(lat[-1] * 1000, 1) if lat else None}
    first_rules = next((r for r in run.results if r.started >= t_kill and r.status == 200
                        and r.body.get("source") == "rules"), None)
    first_model = next((r for r in run.results if r.started >= t_up and r.status == 200
                        and r.body.get("source") == "model"), None)
    out["first_rules_answer_after_kill_s"] = round(first_rules.started + first_rules.latency - t_kill, 3) \
        if first_rules else None
    out["first_model_answer_after_vllm_healthy_s"] = round(first_model.started + first_model.latency - t_up, 3) \
        if first_model else None
    out["failed_requests"] = sum(1 for r in run.results if r.status != 200)
    out["pass"] = (out["failed_requests"] == 0 and out["vllm_down"]["sources"].get("rules", 0) > 0
                   and first_model is not None and error is None)
    return out


def wait_gpus_free(limit_mib: int = 4096, timeout: float = 60.0) -> None:
    """A killed vLLM's GPU memory is returned by the driver a moment later; a new vLLM sizes its KV cache from
    the free memory it finds, so it must not start before."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10).stdout.split()
            if used and all(int(u) < limit_mib for u in used):
                return
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return
        time.sleep(0.5)


async def drift() -> dict:
    proc = await asyncio.create_subprocess_exec(sys.executable, str(Path(__file__).with_name("render_fixture.py")),
                                                "--check", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    text = (await proc.communicate())[0].decode()
    return {"pass": proc.returncode == 0, "output": text.strip()[-600:]}


async def run_checks(tp: int, n: int) -> dict:
    out: dict = {"tp": tp}
    out["fixture_drift"] = await drift()
    await stack.wait_ready(stack.runtime_url("scored") + "/v2/health/ready", 600, "runtime-scored")
    await stack.wait_ready(stack.runtime_url("generated") + "/v2/health/ready", 120, "runtime-generated")
    out["endpoints"] = await check_endpoints(tp)
    scored, apps, results = await check_scored(n)
    out["scored"] = scored
    out["repeat"] = await check_repeat(apps, results)
    out["generated"] = await check_generated(max(200, n // 5))
    modes = await Modes.create()
    out["direct_scored"] = await check_direct(modes, min(n, 500))
    out["decisions_by_input"] = {json.dumps(apps[r.index], sort_keys=True): r.body.get("decision")
                                 for r in results if r.status == 200}
    return out


async def start_stack(tp: int) -> dict:
    t0 = time.time()
    stack.start_vllm(tp)
    stack.start_runtime("scored")
    stack.start_runtime("generated")
    await stack.wait_ready(stack.VLLM_URL + "/health", 480, "vllm")
    return {"vllm_start_s": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-fallback", action="store_true")
    args = ap.parse_args(argv)

    async def go():
        res = await start_stack(args.tp)
        res.update(await run_checks(args.tp, args.n))
        if not args.no_fallback:
            res["fallback"] = await fallback_handback(lambda: stack.start_vllm(args.tp))
        return res

    try:
        res = asyncio.run(go())
    finally:
        stack.stop_all()
    res.pop("decisions_by_input", None)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"check-tp{args.tp}.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
