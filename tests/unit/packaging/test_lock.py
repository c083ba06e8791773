"""The lock (requirements/, written by hack/lock.sh) is what pyproject.toml asks for, one set of versions across its
files, and each program's file carries what that program imports and nothing of the other program's web or cluster
stack."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.paths import REPO

LOCK = REPO / "requirements"
PROGRAMS = {  # extra -> (lock file, the code it runs)
    "operator": ("operator.txt", [REPO / "operator" / "arbiter_operator"]),
    "runtime": ("runtime.txt", [REPO / "runtime" / "arbiter_runtime"]),
    # The plugin, and the operator's own checks its `lint` runs (plan.validate: JSON Schema, CEL).
    "kubectl": ("kubectl.txt", [REPO / "operator" / "arbiter_operator" / "cli",
                                REPO / "operator" / "arbiter_operator" / "plan" / "validate.py"]),
}
OWN = {"arbiter_operator", "arbiter_runtime", "arbiter_devenv"}
# What each image must not hold: the other program's server or cluster stack.
FORBIDDEN = {
    "operator": {"starlette", "uvicorn", "httptools", "fastjsonschema", "boto3", "s3transfer"},
    "runtime": {"kopf", "kubernetes", "msgspec", "defusedxml", "httpx"},
    "kubectl": {"kopf", "starlette", "uvicorn", "tokenizers", "botocore"},
}
# Loaded by name, not imported: uvicorn's loop="uvloop" (arbiter_runtime/__main__.py checks it is there first).
LOADED_BY_NAME = {"runtime": {"uvloop"}}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


@cache
def pins(name: str) -> dict[str, tuple[str, str | None]]:
    """canonical name -> (version, marker) of a lock file; every pin carries its hashes."""
    text = (LOCK / name).read_text()
    out: dict[str, tuple[str, str | None]] = {}
    for block in re.split(r"\n(?=\S)", text):
        first = block.splitlines()[0]
        if first.startswith("#") or not first.strip():
            continue
        m = PIN.match(first)
        assert m, f"{name}: not an exact pin: {first!r}"
        assert "--hash=sha256:" in block, f"{name}: {first} has no hash"
        out[canonicalize_name(m.group(1))] = (m.group(3), m.group(4))
    return out


def _pyproject(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _requirements(extra: str) -> list[Requirement]:
    project = _pyproject(REPO / "pyproject.toml")
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"][extra]]


def _applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate({**default_environment(), "extra": ""})


@pytest.mark.parametrize("extra", [*PROGRAMS, "test"])
def test_every_requirement_is_pinned_within_its_bounds(extra: str) -> None:
    lock = pins("dev.txt" if extra == "test" else PROGRAMS[extra][0])
    reqs = _requirements(extra)
    if extra == "test":
        reqs += [Requirement(r) for r in _pyproject(REPO / "devenv" / "pyproject.toml")["dependencies"]]
    for req in reqs:
        name = canonicalize_name(req.name)
        if name == "arbiter-operator" or not _applies(req):
            continue
        assert name in lock, f"{req} is not in the lock: run bash hack/lock.sh"
        version = lock[name][0]
        assert req.specifier.contains(version, prereleases=True), f"locked {name}=={version} breaks {req}"


def test_the_lock_files_agree_on_every_version() -> None:
    dev = pins("dev.txt")
    for name in ("operator.txt", "runtime.txt", "kubectl.txt", "build.txt"):
        for dist, (version, _) in pins(name).items():
            if dist in dev:
                assert dev[dist][0] == version, f"{name} pins {dist}=={version}, dev.txt {dev[dist][0]}"
    for program, (name, _) in PROGRAMS.items():
        assert set(pins(name)) <= set(dev), f"{program}: the suite does not install all of {name}"


def test_the_build_backend_is_locked() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    build = pins("build.txt")
    for r in [*requires, "build"]:
        req = Requirement(r)
        assert req.specifier.contains(build[canonicalize_name(req.name)][0]), r


def _imports(roots: list[Path]) -> set[str]:
    names: set[str] = set()
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in OWN}


@cache
def _distributions() -> dict[str, list[str]]:
    return {k: [canonicalize_name(d) for d in v] for k, v in importlib.metadata.packages_distributions().items()}


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_lock_file_carries_what_its_program_imports(program: str) -> None:
    name, code = PROGRAMS[program]
    locked = set(pins(name))
    missing = sorted(m for m in _imports(code) if not set(_distributions().get(m, [m])) & locked)
    assert not missing, f"{program} imports {missing}, which {name} does not install: add them to the extra"


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_extra_names_only_what_its_program_imports(program: str) -> None:
    """An image installs only what it runs: every direct dependency of the extra is imported by the program."""
    imported = {d for m in _imports(PROGRAMS[program][1]) for d in _distributions().get(m, [m])}
    imported |= LOADED_BY_NAME.get(program, set())
    project = _pyproject(REPO / "pyproject.toml")
    for r in project["optional-dependencies"][program]:
        req = Requirement(r)
        assert canonicalize_name(req.name) in imported, f"[{program}] names {req.name}, which it never imports"


@pytest.mark.parametrize("program", PROGRAMS)
def test_no_image_carries_the_other_programs_stack(program: str) -> None:
    carried = sorted(set(pins(PROGRAMS[program][0])) & FORBIDDEN[program])
    assert not carried, f"requirements/{PROGRAMS[program][0]} carries {carried}"
