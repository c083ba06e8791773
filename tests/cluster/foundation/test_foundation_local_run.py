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
    # The example's model answers by the example's own policy: the applicant affords the limit, has a long history
    # and asks for a small limit, so every step approves with a code that says why, surer at each step.
    steps = [line.split("step ", 1)[1] for line in out.splitlines() if "  step " in line]
    assert [s.split()[1:4] for s in steps] == [["INCOME_OK", "->", "approved"]] * 3, steps
    approved = [float(s.split("(approved ")[1].split(",")[0]) for s in steps]
    assert approved == sorted(approved) and len(set(approved)) == 3, steps
    # The address to call, not the Route's empty status.url, and what to try next.
    assert "url None" not in out and "answers at http://127.0.0.1:" in out
    assert "kubectl-arbiter" in out and " dashboard " in out and " diagnose credit-limit --metrics-url " in out
    assert "apply --server-side --field-manager arbiter-local -f " in out and "status credit-limit --watch" in out
