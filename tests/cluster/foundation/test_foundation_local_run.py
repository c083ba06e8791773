"""The README's first command keeps working: the local run converges the example to Ready and cleans up."""

from __future__ import annotations

import subprocess
import sys


def test_local_run_brings_the_example_to_ready_and_exits_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "arbiter_devenv.local", "--exit-when-ready", "--timeout", "240",
         "--namespace", "readme-run"],
        capture_output=True, text=True, timeout=420,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # What a newcomer sees: the conditions as they converge, then the active version.
    assert "dm/credit-limit: ArtifactsValid=True" in out
    assert "dm/credit-limit: Ready=True (Promoted)" in out
    assert "dm/credit-limit is Ready: active version 1.0.0" in out
    # ... and ends with a decision from the active version's runtime, authenticated, and the curl to repeat it.
    assert "in front of the vLLM stand-in" in out
    assert "source model, version 1.0.0, trace id " in out  # a model decision, not a rules fallback
    assert "  step 3: " in out and "Authorization: Bearer $TOKEN" in out and "/v1/decisions -d '" in out
