"""What vLLM's engine core spends setting up a decision's regex constraint, without a GPU.

    python benchmarks/gpu/grammar_setup.py [--requests 3000]

Needs xgrammar (vLLM's default structured-output backend), torch and transformers: the GPU image has them. It builds
the benchmark model's tokenizer (build_model.build_tokenizer, on the same corpus), takes the runtime's own regex for
its decision (scored_format, compact, 4 steps) and replays, for each request, what vLLM 0.26's engine core does
before the request can be scheduled (vllm/v1/structured_output/__init__.py `grammar_init`): the compile is submitted
to the structured-output manager's thread pool, where `compile_regex_with_timeout` (vllm/v1/structured_output/
utils.py) runs xgrammar's cached `compile_regex` on a thread pool of its own, made and shut down for every request,
unless VLLM_REGEX_COMPILATION_TIMEOUT_S is 0; then a GrammarMatcher and the first token bitmask.

Per arm it prints the engine core's CPU per request (process time over the run) and the wall time from submit to a
grammar the scheduler can use (p50, p99), alone and with a busy main thread holding the GIL between 1 ms sleeps, as
the engine core's loop does while a request waits for its grammar (vllm/v1/engine/core.py). The code paths are
vLLM's own, copied beside the names of their originals; the figures are the CPU side of a decision's first token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "runtime"))

import underwriting as uw  # noqa: E402


def compile_regex_with_timeout(fn, pattern: str, timeout: float):
    """vllm/v1/structured_output/utils.py compile_regex_with_timeout, with its timeout as an argument."""
    if timeout <= 0:
        return fn(pattern)
    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(fn, pattern)
    try:
        result = future.result(timeout=timeout)
    except FutureTimeout:
        future.cancel()
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=False)
    return result


def tokenizer_info():
    import prompts
    import xgrammar as xgr
    from build_model import build_tokenizer

    apps = uw.applicants(2_000, 0)
    corpus = [t for a in apps for t in (prompts.messages_text(a, "scored"), uw.compact_answer(uw.decide(a)))]
    tok = build_tokenizer(corpus, 1024)
    return xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)), len(tok)


def run_arm(compiler, vocab: int, regex: str, timeout: float, requests: int, busy: bool) -> dict:
    import xgrammar as xgr

    pool = ThreadPoolExecutor()  # StructuredOutputManager.executor
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def create():  # StructuredOutputManager._create_grammar + XgrammarBackend
        ctx = compile_regex_with_timeout(compiler.compile_regex, regex, timeout)
        return xgr.GrammarMatcher(ctx, max_rollback_tokens=0)

    stop = threading.Event()

    def engine_loop() -> None:  # the engine core while the request waits: schedule (GIL held), then sleep 1 ms
        while not stop.is_set():
            end = time.perf_counter() + 0.0005
            while time.perf_counter() < end:
                pass
            time.sleep(0.001)

    loop = threading.Thread(target=engine_loop, daemon=True)
    if busy:
        loop.start()
    waits = []
    cpu0 = time.process_time()
    for _ in range(requests):
        t0 = time.perf_counter()
        future: Future = pool.submit(create)  # grammar_init
        matcher = future.result()
        matcher.fill_next_token_bitmask(bitmask, 0)  # the first step's mask (get_grammar_bitmask)
        waits.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    stop.set()
    if busy:
        loop.join()
    pool.shutdown()
    waits.sort()
    return {"timeout_s": timeout, "busy_engine_loop": busy, "requests": requests,
            # With the busy loop running, the process's CPU is mostly the loop's: CPU is read on the idle arms.
            "cpu_ms_per_request": None if busy else round(1000 * cpu / requests, 3),
            "wait_ms_p50": round(1000 * statistics.median(waits), 3),
            "wait_ms_p99": round(1000 * waits[int(0.99 * (len(waits) - 1))], 3)}


def run_validation(regex: str, timeout: float, requests: int) -> dict:
    """The API server's share: vllm/v1/structured_output/backend_xgrammar.py validate_xgrammar_grammar, run for
    every request before it is sent to the engine core (the regex parsed into a grammar, uncached)."""
    import xgrammar as xgr

    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(requests):
        compile_regex_with_timeout(xgr.Grammar.from_regex, regex, timeout)
    return {"timeout_s": timeout, "requests": requests,
            "cpu_ms_per_request": round(1000 * (time.process_time() - cpu0) / requests, 3),
            "wall_ms_per_request": round(1000 * (time.perf_counter() - t0) / requests, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    import xgrammar as xgr
    from arbiter_runtime.scored_format import scored_format

    info, vocab = tokenizer_info()
    regex = scored_format("compact", list(uw.LABELS), list(uw.CODES), uw.STEPS).regex
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=True)
    compiler.compile_regex(regex)  # the first request compiles; every later one hits xgrammar's cache
    rows = [run_arm(compiler, vocab, regex, timeout, args.requests, busy)
            for busy in (False, True) for timeout in (5.0, 0.0)]
    checks = [run_validation(regex, timeout, args.requests) for timeout in (5.0, 0.0)]
    print(f"vocabulary {vocab} tokens; regex {len(regex)} characters; {args.requests} requests per arm")
    print("API server, validating the request's regex:")
    print(f"{'VLLM_REGEX_COMPILATION_TIMEOUT_S':>33} {'CPU ms/request':>15} {'wall ms/request':>16}")
    for c in checks:
        print(f"{c['timeout_s']:>33g} {c['cpu_ms_per_request']:>15.3f} {c['wall_ms_per_request']:>16.3f}")
    print("engine core, from the request's arrival to a grammar the scheduler can use:")
    print(f"{'VLLM_REGEX_COMPILATION_TIMEOUT_S':>33} {'engine loop':>12} {'CPU ms/request':>15} {'wait p50 ms':>12} "
          f"{'wait p99 ms':>12}")
    for r in rows:
        cpu = "-" if r["cpu_ms_per_request"] is None else f"{r['cpu_ms_per_request']:.3f}"
        print(f"{r['timeout_s']:>33g} {'busy' if r['busy_engine_loop'] else 'idle':>12} {cpu:>15} "
              f"{r['wait_ms_p50']:>12.3f} {r['wait_ms_p99']:>12.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"vocabulary": vocab, "regex_chars": len(regex), "api_server": checks,
                                               "engine_core": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
