#!/usr/bin/env bash
# The main job, locally: sets up, starts an embedded cluster without containers (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok's simulated A100 nodes, the real KServe controller and webhooks, SeaweedFS)
# unless --use-current-context is given, runs the operator, applies examples/ and prints the DecisionModel's conditions
# as it converges. Ctrl-C stops everything.
#
# The first run builds the Go binaries it needs from the Go module proxy, in the order it needs them, each announced
# with roughly how long it takes on 2 cores (cached in ~/.cache/arbiter/bin afterwards; later runs build nothing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kserve-controller seaweedfs)
for arg in "$@"; do
  [ "$arg" = "--use-current-context" ] && tools=()
done
# Roughly how long each first build takes on 2 cores from an empty Go cache (later ones share packages).
declare -A took=(
  [etcd]="about 2 min" [kube-apiserver]="about 10 min" [kube-controller-manager]="about 3 min"
  [kube-scheduler]="about 2 min" [kwok]="about 4 min" [kserve-controller]="about 10 min" [seaweedfs]="about 12 min"
)
bash hack/setup.sh --no-tools
for tool in "${tools[@]}"; do
  if .venv/bin/python -m arbiter_devenv.tools list | grep -q "^$tool	.*	cached	"; then
    continue
  fi
  printf '\033[1m[arbiter]\033[0m building %s (once, %s; cached in ~/.cache/arbiter/bin)\n' "$tool" "${took[$tool]}"
  bash hack/setup.sh "$tool" >/dev/null
done
exec .venv/bin/python -m arbiter_devenv.local "$@"
