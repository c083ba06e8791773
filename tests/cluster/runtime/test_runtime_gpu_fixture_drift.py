"""The GPU fixture model was trained on what the operator renders and the runtime prompts (benchmarks/gpu/fixture).
A change to either shows up here as drift, before anyone spends GPU time on a model that no longer matches."""

from __future__ import annotations

import subprocess
import sys

from support.paths import REPO


def test_gpu_fixture_matches_what_operator_and_runtime_render_now() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu" / "render_fixture.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, (
        "benchmarks/gpu/fixture drifted from the operator's rendering or the runtime's prompts; re-render with "
        "`python benchmarks/gpu/render_fixture.py` and retrain the GPU fixture (docs/gpu.md):\n"
        + proc.stdout + proc.stderr
    )
