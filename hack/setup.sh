#!/usr/bin/env bash
# Installs everything Arbiter's local run and test suite need on a fresh Debian machine with Python >= 3.11 and Go:
# a virtualenv with the project, the Debian packages for the real test servers, and the Go-built binaries
# (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok, the KServe controller, SeaweedFS, Model Registry,
# helm), which are cached per user and version so a second run builds nothing. Idempotent: safe to run again.
#
#   bash hack/setup.sh                 # everything the test suite needs
#   bash hack/setup.sh TOOL...         # only these Go tools, in this order, and no Debian packages (hack/run-local.sh)
#   bash hack/setup.sh --no-tools      # only the virtualenv (a run against an existing cluster)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

python=${PYTHON:-python3}
tools=("$@")

# The Go build (most of a fresh machine's set-up) starts first and runs while pip and apt install: the tool builder
# is standard library only, so it runs from devenv/ before the virtualenv exists. Its lines are prefixed `[go]`.
go_pid=""
if [ "${tools[0]:-}" != "--no-tools" ]; then
  command -v go >/dev/null 2>&1 || { echo "Go (>= 1.24) is required to build kube-apiserver, etcd and the test servers" >&2; exit 1; }
  log "building (or finding cached) Go tools: ${tools[*]:-all}"
  ( set -o pipefail
    PYTHONPATH="$root/devenv" "$python" -m arbiter_devenv.tools build "${tools[@]}" 2>&1 | sed -u 's/^/[go] /' ) &
  go_pid=$!
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=.venv/.arbiter-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ devenv/pyproject.toml -nt "$stamp" ] \
   || [ requirements/dev.txt -nt "$stamp" ] || [ requirements/build.txt -nt "$stamp" ]; then
  log "installing the locked dependencies (requirements/), the project and the development environment (devenv/)"
  .venv/bin/python -m pip install -q --upgrade pip
  # Every version and file hash comes from the lock (hack/lock.sh): the operator's, the runtime's, the plugin's, the
  # tests' and the build backend's, the same versions the images and the release install.
  .venv/bin/python -m pip install -q --require-hashes -r requirements/dev.txt -r requirements/build.txt
  # The checkout itself, editable, with the locked build backend and nothing resolved again. devenv/ is its own
  # distribution (arbiter-devenv): importable here, never in the operator wheel or an image.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e '.[test]' -e ./devenv
  touch "$stamp"
fi

# Debian packages (the test suite's, not the local run's): PostgreSQL (Model Registry's database), Prometheus (promotion
# analysis), Redis (Argo CD's cache, for the GitOps tests) and Chromium with its WebDriver (the dashboard's browser
# tests).
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ -x /usr/lib/postgresql/15/bin/postgres ] || ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ] && [ ${#tools[@]} -eq 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts the packaged services; the tests run their own instances on free ports.
  for svc in prometheus postgresql redis-server; do $sudo systemctl disable --now "$svc" >/dev/null 2>&1 || $sudo service "$svc" stop >/dev/null 2>&1 || true; done
fi

[ -z "$go_pid" ] && exit 0
wait "$go_pid" || { echo "the Go tool build failed (its output above, prefixed [go])" >&2; exit 1; }
