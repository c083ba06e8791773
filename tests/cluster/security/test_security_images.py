"""The Dockerfiles, tested without a container engine: they parse (BuildKit's own parser, through the `dockerfile`
package), their bases are pinned by tag, they run as a non-root numeric user in group 0, the operator's final stage
carries no build tools, its OCI labels are there, its entrypoint exists, and its install step succeeds in a fresh
virtualenv."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import venv

import dockerfile
import pytest
from support.paths import REPO

OPERATOR = REPO / "Dockerfile.operator"
RUNTIME = REPO / "Dockerfile.runtime"
BUILD_TOOLS = ("gcc", "g++", "make", "cmake", "-devel", "python3-pip", "git")
OCI_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.licenses",
    "org.opencontainers.image.source",
)


def _parse(path: pathlib.Path) -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(path)))


def _args(cmds: list[dockerfile.Command]) -> dict[str, str]:
    """Global ARG defaults (before the first FROM), which FROM lines may reference."""
    out: dict[str, str] = {}
    for c in cmds:
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            name, _, default = c.value[0].partition("=")
            out[name] = default.strip('"')
    return out


def _stages(cmds: list[dockerfile.Command]) -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for c in cmds:
        if c.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(c)
    return stages


def _base(stage: list[dockerfile.Command], args: dict[str, str]) -> str:
    image = stage[0].value[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)


def _image_tag(ref: str) -> str | None:
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def _dockerfiles() -> list[pathlib.Path]:
    return [p for p in (OPERATOR, RUNTIME) if p.exists()]


def test_operator_dockerfile_exists_and_parses() -> None:
    cmds = _parse(OPERATOR)
    assert len(_stages(cmds)) >= 2, "multi-stage: build tools stay in the build stage"


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda p: p.name)
def test_bases_are_pinned_by_tag(path: pathlib.Path) -> None:
    cmds = _parse(path)
    args = _args(cmds)
    stage_names = {s[0].value[2].lower() for s in _stages(cmds) if len(s[0].value) >= 3}
    for stage in _stages(cmds):
        ref = _base(stage, args)
        if ref.lower() in stage_names:
            continue  # FROM an earlier stage
        assert "$" not in ref, f"{path.name}: {ref} uses an ARG without a default"
        tag = _image_tag(ref)
        assert tag, f"{path.name}: {ref} has no tag: pin it"
        assert tag not in {"latest", "1", "9"}, f"{path.name}: {ref} floats; pin a release tag"


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda p: p.name)
def test_final_stage_runs_as_numeric_non_root_user_in_group_zero(path: pathlib.Path) -> None:
    final = _stages(_parse(path))[-1]
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users, f"{path.name}: the final stage sets no USER (it would run as the base image's user)"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0, f"{path.name}: USER {users[-1]} must be a numeric non-root UID"
    # OpenShift runs the image with an arbitrary UID in group 0: group 0 is what file permissions must serve.
    assert group in ("", "0"), f"{path.name}: USER {users[-1]}: use group 0 so arbitrary UIDs can read the files"


def test_operator_final_stage_has_no_build_tools() -> None:
    stages = _stages(_parse(OPERATOR))
    final = stages[-1]
    installs = " ".join(c.value[0] for c in final if c.cmd == "RUN")
    for tool in BUILD_TOOLS:
        assert not re.search(rf"(^|[\s/]){re.escape(tool)}(\s|$)", installs) and tool not in installs.split(), tool
    assert not [c for c in final if c.cmd == "RUN" and "pip install" in c.value[0]], "pip runs in the build stage"
    # The base of the final stage is the minimal UBI, not the Python builder image (which ships gcc).
    final_base = _base(final, _args(_parse(OPERATOR)))
    assert "ubi-minimal" in final_base or "ubi-micro" in final_base, final_base
    # What it copies from the build stage is the virtualenv only.
    copies = [c for c in final if c.cmd == "COPY"]
    assert copies and all(any(f.startswith("--from=") for f in c.flags) for c in copies)


def test_operator_image_labels_and_entrypoint() -> None:
    final = _stages(_parse(OPERATOR))[-1]
    labels: dict[str, str] = {}
    for c in final:
        if c.cmd == "LABEL":
            values = list(c.value)
            labels.update({values[i]: values[i + 1] for i in range(0, len(values), 2)})
    missing = [k for k in OCI_LABELS if k not in labels]
    assert not missing, f"OCI labels missing: {missing}"
    (entry,) = [c for c in final if c.cmd == "ENTRYPOINT"]
    assert entry.json, "exec form, so signals reach the operator (kopf drains on SIGTERM)"
    assert entry.value[0] == "/opt/arbiter/bin/arbiter-operator"


def test_operator_image_copies_what_the_install_needs() -> None:
    build = _stages(_parse(OPERATOR))[0]
    for c in build:
        if c.cmd == "COPY" and not any(f.startswith("--from=") for f in c.flags):
            for src in c.value[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A fresh virtualenv with the project installed the way the image's build stage installs it.

    The dependencies are not downloaded again: a .pth line appends the project's own environment's site-packages
    (after the fresh venv's own), so what the entrypoint imports from `arbiter_operator` comes from the fresh install.
    """
    target = tmp_path_factory.mktemp("image-venv") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    py = target / "bin" / "python"
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--quiet",
         str(REPO)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (pathlib.Path(site) / "zz-project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return target


def test_install_step_yields_working_entrypoints(fresh_venv: pathlib.Path) -> None:
    py = fresh_venv / "bin" / "python"
    op = fresh_venv / "bin" / "arbiter-operator"
    assert op.exists(), "pip install did not create the arbiter-operator console script"
    proc = subprocess.run([str(op), "--help"], capture_output=True, text=True, timeout=120, cwd=fresh_venv)
    assert proc.returncode == 0, proc.stderr
    assert "--namespace" in proc.stdout and "--liveness" in proc.stdout
    # The entrypoint ran the freshly installed code, not the checkout's editable install.
    where = subprocess.run(
        [str(py), "-c", "import arbiter_operator, sys; print(arbiter_operator.__file__)"],
        capture_output=True, text=True, check=True, cwd=fresh_venv,
    ).stdout.strip()
    assert where.startswith(str(fresh_venv)), where


def test_operator_install_ships_no_dev_environment_or_stand_in(fresh_venv: pathlib.Path) -> None:
    # What `pip install .` (the image's build stage) installs: the product packages, not devenv/ or the stand-in.
    for c in _stages(_parse(OPERATOR))[0]:
        if c.cmd == "COPY":
            assert not [src for src in c.value[:-1] if src.rstrip("/").startswith("devenv")], c.value
    (record,) = fresh_venv.glob("lib/python*/site-packages/arbiter_operator-*.dist-info/RECORD")
    shipped = [line.split(",")[0] for line in record.read_text().splitlines()]
    assert any(f.startswith("arbiter_operator/") for f in shipped)
    assert any(f.startswith("arbiter_runtime/") for f in shipped)
    leaked = [f for f in shipped if "devenv" in f or "standin" in f]
    assert not leaked, f"the operator distribution ships development files: {leaked}"


def test_chart_flags_are_flags_the_operator_accepts(fresh_venv: pathlib.Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "helm"))
    from support.chartkit import one, render

    (container,) = one(render({"watchedNamespaces": ["a"]}), "Deployment")["spec"]["template"]["spec"]["containers"]
    help_text = subprocess.run(
        [str(fresh_venv / "bin" / "arbiter-operator"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        assert flag in help_text, f"the chart passes {flag}, which arbiter-operator --help does not list"
