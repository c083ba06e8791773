#!/usr/bin/env bash
# Builds every artifact of a release for the images a team built from the Dockerfiles and pushed:
#
#   bash hack/release.sh --operator-image REGISTRY/ORG/arbiter-operator@sha256:... \
#                        --runtime-image  REGISTRY/ORG/arbiter-runtime@sha256:... [--out dist/release]
#
# the wheel and sdist, the Helm chart package (those images as its defaults), the OLM bundle and catalog (those images
# in the CSV and relatedImages; `disconnected` when both are digests), the kubectl plugin's krew archives and manifest
# with their sha256, SHA256SUMS. Tags work too (...:0.1.0); digests are what a disconnected cluster mirrors.
# `--help` lists the rest. devenv/arbiter_devenv/release.py says what each artifact holds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The virtualenv (with the locked build backend) and the two Go tools the release runs: helm, and the Operator
# Framework's bundle validator.
bash hack/setup.sh helm operator-bundle-validator >&2
exec .venv/bin/python -m arbiter_devenv.release "$@"
