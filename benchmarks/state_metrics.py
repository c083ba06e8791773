"""The per-DecisionModel state series at fleet size: one scrape of the operator's metrics with N DecisionModels in its
watch cache (the real WatchCache and collector, the example's spec; a tenth mid-canary with a full last analysis and
history, the rest idle with Ready conditions), as Prometheus would fetch it. Prints the series count, the exposition's
size, and the scrape's wall and CPU time (median and max of the repetitions).

    .venv/bin/python benchmarks/state_metrics.py [--count 1000] [--repetitions 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.state_metrics import DecisionModelStateCollector, cache_lister
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = [{"type": t, "status": s, "reason": "AsExpected", "message": "", "observedGeneration": 1,
               "lastTransitionTime": "2026-12-01T10:00:00Z"}
              for t, s in (("Ready", "True"), ("Reconciling", "False"), ("Stalled", "False"), ("Serving", "True"),
                           ("ArtifactsValid", "True"), ("Registered", "True"))]


def _status(canary: bool) -> dict[str, Any]:
    versions = [{"name": v, "phase": "Ready", "ready": True, "inferenceService": f"dm--{v.replace('.', '-')}"}
                for v in (("1.0.0", "1.1.0") if canary else ("1.0.0",))]
    promotion: dict[str, Any] = {"phase": "Idle", "stable": "1.0.0", "step": -1, "weight": 0, "history": [
        {"version": "1.0.0", "outcome": "Succeeded", "startedAt": "2026-11-01T10:00:00Z",
         "finishedAt": "2026-11-01T10:20:00Z", "durationSeconds": 1200}] * 10}
    if canary:
        checks = [{"name": n, "value": 0.01, "bound": 0.05, "direction": "max", "verdict": "Pass"}
                  for n in ("errorRate", "p95Latency", "fallbackRate", "schemaViolationRate", "lowConfidenceRate",
                            "decisionMixShift")]
        promotion.update(phase="Progressing", candidate="1.1.0", step=1, weight=50,
                         startedAt="2026-12-01T10:00:00Z",
                         lastAnalysis={"at": "2026-12-01T10:05:00Z", "step": 1, "verdict": "Pass", "checks": checks})
    return {"observedGeneration": 1, "conditions": CONDITIONS, "versions": versions, "promotion": promotion}


def fleet(count: int) -> WatchCache:
    base = yaml.safe_load((ROOT / "examples" / "decisionmodel-canary.yaml").read_text())
    cache = WatchCache()
    for i in range(count):
        dm = copy.deepcopy(base)
        dm["metadata"] = {"name": f"dm-{i:04d}", "namespace": f"team-{i % 20:02d}", "resourceVersion": str(i + 1),
                          "uid": f"uid-{i}", "generation": 1}
        dm["status"] = _status(canary=i % 10 == 0)
        cache.put(dm)
    return cache


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--repetitions", type=int, default=20)
    ap.add_argument("--out", help="JSON result path (default: benchmarks/results/state_metrics.json)")
    args = ap.parse_args(argv)
    registry = CollectorRegistry()
    registry.register(DecisionModelStateCollector(cache_lister(fleet(args.count)), lambda: True))
    walls, cpus, body = [], [], b""
    for _ in range(args.repetitions):
        w, c = time.perf_counter(), time.process_time()
        body = generate_latest(registry)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    result = {"count": args.count, "series": series, "bytes": len(body),
              "wall_ms_median": statistics.median(walls) * 1000, "wall_ms_max": max(walls) * 1000,
              "cpu_ms_median": statistics.median(cpus) * 1000}
    print("| models | series | exposition | scrape wall p50 / max | scrape CPU p50 |")
    print("|---|---|---|---|---|")
    print(f"| {args.count:,} | {series:,} | {len(body) / 1024:,.0f} KiB | {result['wall_ms_median']:.1f} / "
          f"{result['wall_ms_max']:.1f} ms | {result['cpu_ms_median']:.1f} ms |")
    common.write_json(result, args.out, "state_metrics.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
