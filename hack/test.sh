#!/usr/bin/env bash
# The whole test suite: sets up (hack/setup.sh) and runs pytest against the real local servers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh
exec .venv/bin/python -m pytest -q -ra "$@"
