"""`hack/release.sh --operator-image REF --runtime-image REF [...]`: every artifact of a release, naming the images a
team built and pushed.

Writes under `--out` (default `dist/release`):
- `python/`: the wheel and the sdist of `arbiter-operator` (one distribution; the images install an extra each),
  built offline with the locked build backend (requirements/build.txt);
- `arbiter-<version>.tgz`: the Helm chart with the LICENSE and the given images as its defaults (`image.*`,
  `runtime.image`), linted (`helm lint --strict`, which applies values.schema.json);
- `olm/`: the OLM bundle, `bundle.Dockerfile` and the file-based catalog, from the generator (olmbundle.py) with the
  given images, checked by the Operator Framework's validator; `disconnected` is true when both images are digests;
- `krew/`: one `kubectl-arbiter` archive per platform (the plugin, its locked dependencies for each supported
  CPython, the LICENSE) and the krew manifest with each archive's sha256;
- `SHA256SUMS`, and `release.json` (version, images, files).

Nothing here needs a container engine: the images are built from the Dockerfiles by the team's own pipeline, before
this runs (docs/install.md, "Releasing for your registry").
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from arbiter_devenv import olmbundle
from arbiter_devenv.generated import write_or_check
from arbiter_devenv.tools import ensure_tool, repo_root

# krew platform -> the wheel platform tags pip may install for it (and the older ones pip derives from each): Linux
# with glibc 2.17 or later, macOS 11 or later.
PLATFORMS: dict[str, tuple[str, ...]] = {
    "linux/amd64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
    "linux/arm64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64"),
    "darwin/amd64": ("macosx_11_0_x86_64",),
    "darwin/arm64": ("macosx_11_0_arm64",),
}
PYTHONS = ("3.11", "3.12", "3.13")
DEFAULT_URL = "https://github.com/arbiter-dev/arbiter/releases/download/v{version}"
MARKER = ".arbiter-release"

LAUNCHER = '''#!/usr/bin/env python3
"""kubectl arbiter {version}: the plugin with its own dependencies (lib/), for CPython {pythons}."""
import os
import sys

if "%d.%d" % sys.version_info[:2] not in {pythons_tuple!r}:
    sys.exit("kubectl-arbiter {version} runs on CPython {pythons}; python3 here is %s" % sys.version.split()[0])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "lib"))
from arbiter_operator.cli.kubectl_arbiter import main  # noqa: E402

sys.exit(main())
'''


@dataclass(frozen=True)
class Release:
    version: str
    images: olmbundle.Images
    out: pathlib.Path


def project_version(root: pathlib.Path) -> str:
    version: str = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((root / "helm" / "arbiter" / "Chart.yaml").read_text())
    if not chart["version"] == chart["appVersion"] == version:
        raise SystemExit(f"pyproject.toml says {version}, Chart.yaml version {chart['version']} and appVersion "
                         f"{chart['appVersion']}: a release has one version")
    return version


def _run(cmd: list[str], **kw: Any) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def python_dists(root: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """sdist, then the wheel built from it (pypa/build), offline, with the backend of requirements/build.txt."""
    dest = out / "python"
    with tempfile.TemporaryDirectory(prefix="arbiter-build-") as tmp:
        # A clean copy of what the sdist may take, so no build folder or egg-info lands in the checkout.
        src = pathlib.Path(tmp) / "src"
        for part in ("pyproject.toml", "README.md", "LICENSE", "operator", "runtime"):
            origin = root / part
            if origin.is_dir():
                shutil.copytree(origin, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                src.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, src / part)
        env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")}
        _run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dest), str(src)],
             env=env)
    return sorted(dest.iterdir())


def _set_value(text: str, block: str, key: str, value: str) -> str:
    """`key: value` inside the top-level `block:` of values.yaml, comments kept (a YAML dump would drop them)."""
    pattern = re.compile(rf"(^{block}:\n(?:(?:  .*|\s*)\n)*?  {key}: ).*$", re.MULTILINE)
    new, n = pattern.subn(lambda m: m.group(1) + json.dumps(value), text, count=1)
    if n != 1:
        raise SystemExit(f"values.yaml has no {block}.{key}")
    return new


def chart_package(root: pathlib.Path, rel: Release) -> pathlib.Path:
    op = rel.images.operator
    assert op is not None
    helm = str(ensure_tool("helm", quiet=True))
    with tempfile.TemporaryDirectory(prefix="arbiter-chart-") as tmp:
        chart = pathlib.Path(tmp) / "arbiter"
        shutil.copytree(root / "helm" / "arbiter", chart)
        shutil.copy2(root / "LICENSE", chart / "LICENSE")
        values = (chart / "values.yaml").read_text()
        values = _set_value(values, "image", "repository", op.repository)
        values = _set_value(values, "image", "tag", op.tag or "")
        values = _set_value(values, "image", "digest", op.digest or "")
        values = _set_value(values, "runtime", "image", rel.images.runtime)
        (chart / "values.yaml").write_text(values)
        env = {**os.environ, **{f"HELM_{k}_HOME": f"{tmp}/{k.lower()}" for k in ("CACHE", "CONFIG", "DATA")}}
        _run([helm, "lint", "--strict", str(chart)], env=env)
        _run([helm, "package", str(chart), "--destination", str(rel.out)], env=env)
    return rel.out / f"arbiter-{rel.version}.tgz"


def olm(root: pathlib.Path, rel: Release, validate: bool) -> pathlib.Path:
    dest = rel.out / "olm"
    files = olmbundle.render(root, rel.images)
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            write_or_check(files, False, "hack/release.sh", dest)
        finally:
            sys.stdout = stdout
    if validate:
        out = _run([str(ensure_tool("operator-bundle-validator", quiet=True)), "--k8s-version", "1.34",
                    str(dest / "bundle")], timeout=300)
        if json.loads(out):
            raise SystemExit(f"the Operator Framework validator reports on the bundle:\n{out}")
    return dest


def _reproducible_tar(files: Iterable[tuple[str, pathlib.Path]], dest: pathlib.Path) -> None:
    """A .tar.gz that depends only on the files' names, contents and modes: sorted, owner 0, fixed times."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 315532800
            with open(path, "rb") as f:
                tar.addfile(info, f)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())


def _pip_target(wheel: pathlib.Path, lock: pathlib.Path, target: pathlib.Path, tags: tuple[str, ...],
                python: str) -> None:
    """The plugin's locked dependencies (hashes checked) and the project's wheel, for one platform and CPython."""
    platform = [a for t in tags for a in ("--platform", t)]
    common = ["--target", str(target), "--only-binary", ":all:", "--python-version", python, "--implementation",
              "cp", "--abi", f"cp{python.replace('.', '')}", *platform, "--no-compile", "--quiet",
              "--disable-pip-version-check"]
    pip = [sys.executable, "-m", "pip", "install"]
    _run([*pip, *common, "--require-hashes", "-r", str(lock)])
    _run([*pip, *common, "--no-deps", "--upgrade", str(wheel)])


def krew(root: pathlib.Path, rel: Release, wheel: pathlib.Path, platforms: list[str], pythons: list[str],
         url: str) -> list[pathlib.Path]:
    dest = rel.out / "krew"
    dest.mkdir(parents=True, exist_ok=True)
    lock = root / "requirements" / "kubectl.txt"
    # pip judges environment markers by the machine it runs on, not the target platform: one set for every platform.
    marked = re.findall(r"^[A-Za-z0-9].*;.*$", lock.read_text(), re.MULTILINE)
    if marked:
        raise SystemExit(f"{lock.relative_to(root)} has platform markers ({marked[0]}): the krew archives cannot be "
                         "built for other platforms from it")
    manifest = yaml.safe_load((root / "plugins" / "krew" / "arbiter.yaml").read_text())
    manifest["spec"]["version"] = f"v{rel.version}"
    entries, archives = [], []
    for platform in platforms:
        os_name, arch = platform.split("/")
        with tempfile.TemporaryDirectory(prefix="arbiter-krew-") as tmp:
            stage = pathlib.Path(tmp)
            for python in pythons:  # one tree: pure files agree, extension modules differ by their ABI suffix
                part = stage / f"py{python}"
                _pip_target(wheel, lock, part, PLATFORMS[platform], python)
                shutil.copytree(part, stage / "lib", dirs_exist_ok=True)
                shutil.rmtree(part)
            launcher = stage / "kubectl-arbiter"
            launcher.write_text(LAUNCHER.format(version=rel.version, pythons=", ".join(pythons),
                                                pythons_tuple=tuple(pythons)))
            launcher.chmod(0o755)
            shutil.copy2(root / "LICENSE", stage / "LICENSE")
            files = [(str(p.relative_to(stage)), p) for p in stage.rglob("*") if p.is_file()]
            name = f"kubectl-arbiter-v{rel.version}-{os_name}-{arch}.tar.gz"
            _reproducible_tar(files, dest / name)
        archives.append(dest / name)
        entries.append({
            "selector": {"matchLabels": {"os": os_name, "arch": arch}},
            "uri": f"{url.format(version=rel.version)}/{name}",
            "sha256": sha256(dest / name),
            "bin": "kubectl-arbiter",
            "files": [{"from": "kubectl-arbiter", "to": "."}, {"from": "lib", "to": "."},
                      {"from": "LICENSE", "to": "."}],
        })
    manifest["spec"]["platforms"] = entries
    (dest / "arbiter.yaml").write_text(
        "# krew plugin manifest for `kubectl arbiter`, written by hack/release.sh.\n"
        + yaml.safe_dump(manifest, sort_keys=False, width=120))
    return [*archives, dest / "arbiter.yaml"]


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fresh(out: pathlib.Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise SystemExit(f"{out} holds files this script did not write: choose an empty --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by hack/release.sh; emptied by its next run\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operator-image", required=True, help="the pushed operator image (tag or @sha256 digest)")
    parser.add_argument("--runtime-image", required=True, help="the pushed runtime image (tag or @sha256 digest)")
    parser.add_argument("--bundle-image", help="the bundle image the catalog names (default: the operator image's "
                        "repository + '-bundle:v<version>'; build it from olm/bundle.Dockerfile)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="where to write (default dist/release)")
    parser.add_argument("--krew-platforms", default=",".join(PLATFORMS), help="os/arch list (default: all)")
    parser.add_argument("--krew-pythons", default=",".join(PYTHONS), help="CPython versions the plugin runs on")
    parser.add_argument("--krew-url", default=DEFAULT_URL, help="where the archives are published ({version})")
    parser.add_argument("--no-validate", action="store_true", help="skip the Operator Framework validator")
    args = parser.parse_args(argv)
    root = repo_root()
    version = project_version(root)
    platforms = [p for p in args.krew_platforms.split(",") if p]
    unknown = [p for p in platforms if p not in PLATFORMS]
    if unknown:
        parser.error(f"--krew-platforms: {unknown} not among {list(PLATFORMS)}")
    try:
        operator = olmbundle.parse_image(args.operator_image)
        bundle = args.bundle_image or f"{operator.repository}-bundle:v{version}"
        images = olmbundle.images_from(args.operator_image, args.runtime_image, bundle)
    except ValueError as exc:
        parser.error(str(exc))
    rel = Release(version, images, (args.out or root / "dist" / "release").resolve())
    _fresh(rel.out)
    dists = python_dists(root, rel.out)
    wheel = next(p for p in dists if p.suffix == ".whl")
    made = [*dists, chart_package(root, rel)]
    olm_dir = olm(root, rel, validate=not args.no_validate)
    made += sorted(p for p in olm_dir.rglob("*") if p.is_file())
    made += krew(root, rel, wheel, platforms, [p for p in args.krew_pythons.split(",") if p], args.krew_url)
    sums = "".join(f"{sha256(p)}  {p.relative_to(rel.out)}\n" for p in made)
    (rel.out / "SHA256SUMS").write_text(sums)
    (rel.out / "release.json").write_text(json.dumps({
        "version": version,
        "images": {"operator": str(images.operator), "runtime": images.runtime, "bundle": images.bundle},
        "disconnected": all("@sha256:" in i for i in (str(images.operator), images.runtime)),
        "files": [str(p.relative_to(rel.out)) for p in made],
    }, indent=2) + "\n")
    print(f"release {version} in {rel.out}: {len(made)} files (SHA256SUMS, release.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
