"""CI smoke of the sequential analysis simulation (benchmarks/sequential_analysis.py): a reduced run (20 identical
canaries, 10 per regression, at 50 decisions/s) completes, prints both tables and writes its JSON. It is pure and
seeded, so what it decides is asserted too: no identical canary is rolled back, and every regression is rolled back
by the Sequential mode. The figures themselves (1,000 canaries, three rates) belong in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

from support.paths import REPO


def test_the_simulation_runs_and_decides_as_the_statistics_promise(tmp_path):
    out = tmp_path / "sequential.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "sequential_analysis.py"), "--canaries", "20",
         "--regression-canaries", "10", "--rates", "50", "--alphas", "0.05", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## A/A canaries" in proc.stdout and "## Regressions" in proc.stdout
    result = json.loads(out.read_text())
    modes = {(r["mode"], r["rate"]) for r in result["aa"]}
    assert modes == {("Windowed", 50.0), ("Sequential", 50.0)}
    for r in result["aa"]:
        assert r["promoted"] + r["rollback"] + r["deadline"] == r["canaries"] == 20
        if r["mode"] == "Sequential":
            assert r["rollback"] == 0, r
    assert {r["regression"] for r in result["regressions"]} == {
        "fallback 1% -> 5%", "decision mix +15 points on one label", "p99 latency +50%"}
    for r in result["regressions"]:
        assert r["Sequential"]["rollback"] == r["Sequential"]["canaries"] == 10, r
        assert r["speedup"] is not None and r["speedup"] > 1, r
