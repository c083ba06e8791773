#!/usr/bin/env bash
# The main job, locally: sets up, starts an embedded control plane (kube-apiserver + etcd, the KServe stand-in) unless
# --use-current-context is given, runs the operator, applies examples/ and prints the DecisionModel's conditions as
# it converges. Ctrl-C stops everything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh
exec .venv/bin/python -m arbiter_operator.devenv.local "$@"
