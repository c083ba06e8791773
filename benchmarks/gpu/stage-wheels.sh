#!/bin/bash
# Stage, in .whl/ (git-ignored), the wheels the decision server needs on the GPU host beyond what its image and
# the vLLM staging (benchmarks/gpu/README.md: starlette, uvicorn, jsonschema, pydantic, httpx's friends...) bring:
# cel-python (the rules fallback) and its compiled dependencies, orjson and fastjsonschema (the hot path uses them
# where installed). aiohttp, httpx, prometheus-client, tokenizers and pyyaml are on the image. One version of each package only: two copies of
# one package stop the install there.
set -eu
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform any"
mkdir -p .whl
for p in cel-python==0.5.0 google-re2 pendulum tzdata orjson fastjsonschema; do
  python3 -m pip download -q --no-deps $plat -d .whl "$p"
done
ls -la .whl
