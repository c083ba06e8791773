"""A Dockerfile stage's own COPY and RUN instructions, run on this machine without a container engine.

No engine runs here and the base images cannot be pulled, so the tests run what an image build runs: each COPY copies
from the checkout, each RUN runs its very text under `sh -c`, with the image's absolute paths moved under a scratch
root (`/opt/arbiter` becomes `<root>/opt/arbiter`) and the base image's interpreter replaced by one given here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile

from support.paths import REPO

# The image paths a stage writes or reads: moved under the scratch root.
IMAGE_PATH = re.compile(r"(?<![\w./$-])/(?=(opt|tmp|src|usr/local/bin|licenses)(/|\b))")


def stages(path: Path) -> list[list[dockerfile.Command]]:
    out: list[list[dockerfile.Command]] = []
    for c in dockerfile.parse_file(str(path)):
        if c.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(c)
    return out


@dataclass
class StageRun:
    root: Path
    interpreters: dict[str, str] = field(default_factory=dict)  # image path of an interpreter -> this machine's
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for part in ("tmp", "opt", "usr/local/bin"):  # what every base image has
            (self.root / part).mkdir(parents=True, exist_ok=True)

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def shell(self, text: str) -> str:
        for image, here in self.interpreters.items():
            text = text.replace(image, here)
        return IMAGE_PATH.sub(f"{self.root}/", text)

    def run(self, stage: list[dockerfile.Command], timeout: float = 600) -> None:
        workdir = "/"
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **self.env}
        for c in stage:
            if c.cmd == "WORKDIR":
                workdir = c.value[0]
                self.path(workdir).mkdir(parents=True, exist_ok=True)
            elif c.cmd == "COPY":
                assert not any(f.startswith("--from=") for f in c.flags), "only the build context is copied here"
                *sources, dest = c.value
                target = self.path(dest if dest.startswith("/") else f"{workdir.rstrip('/')}/{dest}")
                for src in sources:
                    origin = REPO / src
                    assert origin.exists(), f"COPY {src}: not in the repository"
                    into = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
                    into.parent.mkdir(parents=True, exist_ok=True)
                    if origin.is_dir():
                        shutil.copytree(origin, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
                            "__pycache__", "*.egg-info"))
                    else:
                        shutil.copy2(origin, into)
            elif c.cmd == "RUN":
                script = self.shell(c.value[0])
                self.log.append(script)
                proc = subprocess.run(["sh", "-c", script], cwd=self.path(workdir), env=env, capture_output=True,
                                      text=True, timeout=timeout)
                assert proc.returncode == 0, f"RUN {c.value[0]}\nexit {proc.returncode}\n{proc.stdout}{proc.stderr}"


def lock_pins(name: str) -> dict[str, str]:
    """canonical name -> version of a file of requirements/."""
    from packaging.utils import canonicalize_name

    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", (REPO / "requirements" / name).read_text(),
                      re.MULTILINE)
    return {canonicalize_name(n): v for n, v in pins}
