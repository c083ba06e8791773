"""The runtime image's install lines (Dockerfile.runtime), run here as the build runs them on a stand-in for vLLM's
environment: the base's versions stay, the lock adds the rest with its hashes, nothing of the operator is installed,
and the entrypoint starts the decision server's command line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import venv

import pytest
from packaging.utils import canonicalize_name
from support.dockerfile_stage import StageRun, lock_pins, stages
from support.paths import REPO

RUNTIME = REPO / "Dockerfile.runtime"


@pytest.fixture(scope="module")
def runtime_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[StageRun, pathlib.Path]:
    """The runtime image's RUN and COPY lines on a stand-in for vLLM's environment: a virtualenv that already holds
    two of the runtime's dependencies at versions other than the lock's, as vLLM's image does."""
    root = tmp_path_factory.mktemp("runtime-image")
    base = root / "vllm-env"
    venv.EnvBuilder(with_pip=True, clear=True).create(base)
    proc = subprocess.run([str(base / "bin" / "python"), "-m", "pip", "install", "-q", *BASE_HAS], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stderr
    run = StageRun(root, env={"PATH": f"{base / 'bin'}:/usr/bin:/bin"})
    run.run(stages(RUNTIME)[-1])
    return run, base


# Two of the runtime's dependencies that vLLM's image also has, at versions other than the lock's.
BASE_HAS = ("prometheus-client==0.21.1", "pyyaml==6.0.2")


def test_runtime_layer_keeps_the_bases_versions_and_adds_the_lock(runtime_build) -> None:
    run, base = runtime_build
    listed = subprocess.run([str(base / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    installed = {canonicalize_name(d["name"]): d["version"] for d in json.loads(listed)}
    for pin in BASE_HAS:
        name, version = pin.split("==")
        assert installed[canonicalize_name(name)] == version, f"the layer changed the base's {name}"
    locked = lock_pins("runtime.txt")
    for name in ("starlette", "uvicorn", "httptools", "cel-python", "fastjsonschema", "boto3", "tokenizers"):
        assert installed[name] == locked[name], name
    for absent in ("kopf", "kubernetes", "msgspec", "httpx", "arbiter-operator"):
        assert absent not in installed, f"the runtime image installs {absent}"
    assert run.path("/licenses/LICENSE").read_text() == (REPO / "LICENSE").read_text()


def test_runtime_entrypoint_runs_the_decision_server(runtime_build) -> None:
    run, base = runtime_build
    entry = run.path("/usr/local/bin/arbiter-runtime")
    env = {**os.environ, "PATH": f"{base / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(run.path("/opt/arbiter"))}
    proc = subprocess.run([str(entry), "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=run.root)
    assert proc.returncode == 0, proc.stderr
    assert "supervise" in proc.stdout or "--model-dir" in proc.stdout, proc.stdout
    # Nothing of the operator: the image copies the runtime package alone.
    assert not (run.path("/opt/arbiter") / "arbiter_operator").exists()
