"""The context routing benchmark runs to the end in its reduced form (CI smoke; its numbers are not judged here):
every routed request was forwarded, and the forwarding server decided none of them itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO


@pytest.mark.slow
def test_context_routing_benchmark_completes(tmp_path):
    out = tmp_path / "context_routing.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "context_routing.py"), "--quick",
                           "--concurrency", "1,8", "--requests", "60", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert {(r["run"], r["concurrency"]) for r in report["results"]} == {
        ("direct", 1), ("routed", 1), ("direct", 8), ("routed", 8)}
    routed = sum(r["requests"] for r in report["results"] if r["run"] == "routed")
    assert report["stable_counted"]["forwarded"] >= routed and report["stable_counted"]["decisions"] == 0
    assert "routing adds" in proc.stdout
