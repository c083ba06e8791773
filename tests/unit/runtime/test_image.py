"""Dockerfile.runtime installs every third-party package the runtime imports, and runs what the operator runs."""

from __future__ import annotations

import ast
import re
import sys

from support.paths import REPO

PACKAGE = REPO / "runtime" / "arbiter_runtime"
def _imports() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "arbiter_runtime"}


def test_the_image_installs_the_lock_and_keeps_no_list_of_its_own():
    """The runtime's dependencies come from requirements/runtime.txt (tests/unit/packaging/test_lock.py checks that
    it carries every package the runtime imports); the Dockerfile names no package or version itself."""
    text = (REPO / "Dockerfile.runtime").read_text()
    assert "COPY requirements/runtime.txt " in text and "-r $b/missing.txt" in text
    assert not re.search(r'"[A-Za-z0-9_.\-]+(>=|==)', text), "Dockerfile.runtime names a dependency by hand"
    assert _imports(), "the runtime imports third-party packages: the lock must hold them"


def test_image_runs_the_command_the_serving_runtime_names():
    text = (REPO / "Dockerfile.runtime").read_text()
    assert 'ENTRYPOINT ["arbiter-runtime"]' in text and "/usr/local/bin/arbiter-runtime" in text
    assert "FROM ${VLLM_IMAGE}" in text and "ARG VLLM_IMAGE=vllm/vllm-openai:v0.26.0" in text
    assert "COPY runtime/arbiter_runtime " in text and (REPO / "runtime" / "arbiter_runtime").is_dir()


def test_runtime_image_carries_neither_the_vllm_stand_in_nor_the_dev_environment():
    # The image copies the runtime package and nothing else of the checkout; the stand-in lives in devenv/.
    copied = [line.split()[1:-1] for line in (REPO / "Dockerfile.runtime").read_text().splitlines()
              if line.startswith("COPY ")]
    assert copied == [["requirements/runtime.txt", "hack/image/lock_beside_base.py"], ["LICENSE"],
                      ["runtime/arbiter_runtime"]], copied
    assert not [p.name for p in PACKAGE.rglob("*standin*")], "a vLLM stand-in sits in the runtime package"
    assert "arbiter_devenv" not in _imports(), "the runtime imports the development environment"
    assert (REPO / "devenv" / "arbiter_devenv" / "vllm_standin.py").is_file()
