#!/usr/bin/env bash
# The whole test suite: sets up (hack/setup.sh), runs ruff and mypy, then pytest against the real local servers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh
# Lint and types first: a finding fails the run before any server starts (settings in pyproject.toml).
echo "[test] ruff check ." >&2
.venv/bin/ruff check .
echo "[test] mypy operator/arbiter_operator runtime/arbiter_runtime" >&2
.venv/bin/mypy operator/arbiter_operator
.venv/bin/mypy runtime/arbiter_runtime
# Tools only the suite needs (OLM's operators and opm, for the OLM install test; Argo CD, for the GitOps tests); the
# local run does without them.
.venv/bin/python -m arbiter_devenv.tools build olm olm-catalog opm argocd
exec .venv/bin/python -m pytest -q -ra "$@"
