#!/usr/bin/env bash
# Locks every Python dependency: one resolution for everything the suite installs (requirements/dev.txt), then each
# program's own set at the same versions, with the hashes of every file PyPI serves for them.
#
#   bash hack/lock.sh                  # re-lock after changing a dependency in pyproject.toml or devenv/pyproject.toml
#   bash hack/lock.sh --upgrade        # move every pin to the newest release the bounds allow
#   bash hack/lock.sh --upgrade-package starlette
#
# requirements/dev.txt        hack/setup.sh (CI and the local run): the project's test extra and devenv/
# requirements/operator.txt   Dockerfile.operator: `arbiter-operator[operator]`
# requirements/runtime.txt    Dockerfile.runtime: `arbiter-operator[runtime]` (vLLM's own versions win where they overlap)
# requirements/kubectl.txt    hack/release.sh: the kubectl plugin's krew archive
# requirements/build.txt      hack/release.sh and the images: the build backend that turns the checkout into a wheel
#
# The files are universal (any OS and CPU, CPython 3.11 and later: the operator image runs 3.11, vLLM's 3.12).
# The resolver is uv, pinned here and installed on first use under ~/.cache/arbiter; the files are plain pip
# requirements, so nothing else needs uv. tests/unit/test_lock.py fails when a file no longer matches pyproject.toml.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

UV_VERSION=0.13.8
tool_dir=${XDG_CACHE_HOME:-$HOME/.cache}/arbiter/uv-$UV_VERSION
if [ ! -x "$tool_dir/bin/uv" ]; then
  "${PYTHON:-python3}" -m venv "$tool_dir"
  "$tool_dir/bin/python" -m pip install -q "uv==$UV_VERSION"
fi
uv=$tool_dir/bin/uv

compile() {  # OUTPUT INPUT... [uv options]
  local out=$1; shift
  "$uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes --no-strip-extras \
    --custom-compile-command "bash hack/lock.sh" -o "$out" "$@"
}

# Pins already in dev.txt are kept unless --upgrade says otherwise (uv reads the output file as its preferences).
compile requirements/dev.txt pyproject.toml devenv/pyproject.toml --extra test "$@"
for program in operator runtime kubectl; do
  compile "requirements/$program.txt" pyproject.toml --extra "$program" -c requirements/dev.txt
done
build_in=$(mktemp); trap 'rm -f "$build_in"' EXIT
python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"] + ["build>=1.2"]))' > "$build_in"
compile requirements/build.txt "$build_in" -c requirements/dev.txt
sed -i "s#$build_in#requirements/build.in#" requirements/build.txt 2>/dev/null || true
echo "locked: $(grep -c '==' requirements/dev.txt) packages for the suite; operator $(grep -c '==' requirements/operator.txt), runtime $(grep -c '==' requirements/runtime.txt), kubectl $(grep -c '==' requirements/kubectl.txt), build $(grep -c '==' requirements/build.txt)"
