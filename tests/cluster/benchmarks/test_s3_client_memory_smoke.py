"""CI smoke test of benchmarks/s3_client_memory.py: one fresh process per S3 client against the S3 server
(SeaweedFS), the table printed and the JSON written. No figure is asserted here: they belong in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.timeout(300)]


def test_s3_client_memory_runs_every_client_and_reports(tmp_path):
    from arbiter_devenv.tools import ensure_tool

    ensure_tool("seaweedfs")
    out = tmp_path / "s3.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "s3_client_memory.py"), "--compare",
                           "--repetitions", "1", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"operator", "operator-web-identity", "boto3-full", "boto3-trimmed",
                            "boto3-trimmed-endpoints"}
    for kind, figures in results.items():
        assert f"| {kind} |" in proc.stdout
        assert figures["base_mib"] <= figures["imported_mib"] and figures["first_check_mib"] > 0
