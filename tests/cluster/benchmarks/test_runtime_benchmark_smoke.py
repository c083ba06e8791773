"""The runtime overhead benchmark runs to the end in its reduced form (CI smoke; its numbers are not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO


@pytest.mark.slow
def test_runtime_overhead_benchmark_completes(tmp_path):
    out = tmp_path / "runtime_overhead.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "runtime_overhead.py"), "--quick",
                           "--concurrency", "1,4", "--requests", "50", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [r["concurrency"] for r in result["results"]] == [1, 4]
    assert all(r["requests"] > 0 and r["decisions_per_s"] > 0 for r in result["results"])
    assert "added p50/p99 ms" in proc.stdout
