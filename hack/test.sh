#!/usr/bin/env bash
# The whole test suite: sets up (hack/setup.sh), runs ruff and mypy, then pytest against the real local servers.
#
#   bash hack/test.sh                     # everything, as CI runs it
#   bash hack/test.sh tests/cluster/helm  # pytest arguments are passed on
#   ARBITER_TEST_WORKERS=0 bash hack/test.sh ...   # one process (no pytest-xdist), e.g. to debug with -s
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh

log() { printf '[test] %s\n' "$*" >&2; }

# Lint and types (settings in pyproject.toml) run side by side with the build of the tools only the suite needs
# (OLM's operators and opm, for the OLM install test; Argo CD, for the GitOps tests; KServe's 0.15 line, for the test
# of OpenShift AI 2.x's KServe; the local run does without them): the checkers are single-threaded, the Go build takes
# what is left. A finding still fails the run before any
# server starts.
lint_dir=$(mktemp -d)
trap 'rm -rf "$lint_dir"' EXIT
# Each mypy run has a cache of its own: two runs writing one fresh cache at once can crash mypy (INTERNAL ERROR).
checks=(
  "ruff check ."
  "mypy --cache-dir .mypy_cache/operator operator/arbiter_operator"
  "mypy --cache-dir .mypy_cache/runtime runtime/arbiter_runtime"
)
pids=()
for i in "${!checks[@]}"; do
  log "${checks[$i]}"
  # shellcheck disable=SC2086  # the command line is split on purpose
  .venv/bin/${checks[$i]} >"$lint_dir/$i.log" 2>&1 &
  pids+=($!)
done
log "tools build olm olm-catalog opm argocd kserve-controller-0.15"
.venv/bin/python -m arbiter_devenv.tools build olm olm-catalog opm argocd kserve-controller-0.15
failed=0
for i in "${!checks[@]}"; do
  if ! wait "${pids[$i]}"; then
    log "FAILED: ${checks[$i]}"
    cat "$lint_dir/$i.log" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1

# pytest-xdist: three workers on a 2-core machine (most of a cluster test's time is spent waiting for controllers and
# timers: with two, the cores were idle half the run; three took the suite from 1,220 s to 901 s, 1,497 tests).
# Each worker has its own session-wide cluster, S3 server (SeaweedFS) and Prometheus. --dist loadgroup: the tests of a
# module that share a module-scoped server stay on one worker, so it starts once (tests/conftest.py groups them);
# every other test goes to the next free worker. --durations: the slowest tests, every run.
workers=${ARBITER_TEST_WORKERS:-3}
xdist=()
[ "$workers" = "0" ] || xdist=(-n "$workers" --dist loadgroup)
exec .venv/bin/python -m pytest -q -ra --durations=20 "${xdist[@]}" "$@"
