"""The shadow overhead benchmark runs to the end in its reduced form (CI smoke; its numbers are not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO


@pytest.mark.slow
def test_shadow_overhead_benchmark_completes(tmp_path):
    out = tmp_path / "shadow_overhead.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "shadow_overhead.py"), "--quick",
                           "--concurrency", "8", "--requests", "80", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {r["run"]: r for r in json.loads(out.read_text())["results"]}
    assert set(runs) == {"off", "rate 0.1", "rate 1.0"}
    assert runs["off"]["shadow_sent"] == 0 and runs["off"]["requests"] == 80
    # every request of the rate-1.0 run was mirrored or dropped, and the candidate (same answers) agreed
    rate1 = runs["rate 1.0"]
    assert rate1["shadow_sent"] + rate1["shadow_dropped"] == 80 and rate1["shadow_error"] == 0
    assert rate1["shadow_agreeing_rows"] == rate1["shadow_compared"] == rate1["shadow_sent"] > 0
    assert "p50 ms" in proc.stdout
