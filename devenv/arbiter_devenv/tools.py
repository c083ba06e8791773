"""Build and cache the Go binaries the development environment runs (kube-apiserver, etcd, SeaweedFS, ...).

Each binary has a tools module under ``hack/tools/<name>/`` with a ``tool.json`` that says what to build (see
hack/tools/README.md). ``ensure_tool(name)`` builds it once with ``go build`` from the Go module proxy into
``${XDG_CACHE_HOME:-~/.cache}/arbiter/bin/<name>-<version>/<binary>`` and afterwards returns the cached path without
touching Go at all. Nothing here knows about any particular tool: adding a tool means adding a folder.

CLI: ``python -m arbiter_devenv.tools build [names...]`` (all tools when no name is given),
``... path NAME`` prints the binary's path (building it when missing), ``... list`` shows what is known.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

__all__ = ["Tool", "ToolError", "cache_root", "ensure_tool", "load_tool", "repo_root", "tool_names", "tools_dir"]


class ToolError(RuntimeError):
    """A tool could not be found or built; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    version: str
    package: str
    binary: str
    ldflags: str
    env: dict[str, str]
    module_dir: pathlib.Path
    # Built only when named or needed (ensure_tool), not by `tools build` without names (hack/setup.sh): for tools
    # whose cold build is too long for every CI run, used by opt-in tests.
    optional: bool = False

    @property
    def cache_path(self) -> pathlib.Path:
        return cache_root() / f"{self.name}-{self.version}" / self.binary

    @property
    def stamp_path(self) -> pathlib.Path:
        return self.cache_path.with_name(f".{self.binary}.inputs")

    def inputs_digest(self) -> str:
        """Digest of what the build depends on here: a go.mod or ldflags change without a version bump still
        rebuilds instead of serving a stale binary."""
        h = hashlib.sha256()
        for path in sorted(self.module_dir.iterdir()):
            if path.is_file() and (path.suffix in (".go", ".mod", ".sum", ".json")):
                h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()

    def is_cached(self) -> bool:
        try:
            return self.cache_path.is_file() and self.stamp_path.read_text().strip() == self.inputs_digest()
        except FileNotFoundError:
            return False


def cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "arbiter" / "bin"


def _candidate_roots() -> Iterator[pathlib.Path]:
    # An explicit setting wins, then the checkout this module lives in (editable installs), then the working
    # directory and its parents (a wheel installed into a venv while running from a checkout).
    env = os.environ.get("ARBITER_REPO_ROOT")
    if env:
        yield pathlib.Path(env)
    yield from pathlib.Path(__file__).resolve().parents
    cwd = pathlib.Path.cwd().resolve()
    yield cwd
    yield from cwd.parents


def repo_root() -> pathlib.Path:
    """The Arbiter checkout: the first candidate folder that holds hack/tools/*/tool.json."""
    for root in _candidate_roots():
        candidate = root / "hack" / "tools"
        if candidate.is_dir() and any(candidate.glob("*/tool.json")):
            return root
    raise ToolError(
        "cannot find hack/tools/*/tool.json: run from an Arbiter checkout or set ARBITER_REPO_ROOT to one"
    )


def tools_dir() -> pathlib.Path:
    return repo_root() / "hack" / "tools"


def tool_names() -> list[str]:
    return sorted(p.parent.name for p in tools_dir().glob("*/tool.json"))


def load_tool(name: str) -> Tool:
    module_dir = tools_dir() / name
    spec_file = module_dir / "tool.json"
    if not spec_file.is_file():
        raise ToolError(f"unknown tool {name!r}: no {spec_file} (known: {', '.join(tool_names())})")
    spec = json.loads(spec_file.read_text())
    missing = [k for k in ("name", "version", "package") if not spec.get(k)]
    if missing:
        raise ToolError(f"{spec_file}: missing {', '.join(missing)}")
    if spec["name"] != name:
        raise ToolError(f"{spec_file}: name {spec['name']!r} does not match its folder {name!r}")
    return Tool(
        name=name,
        version=spec["version"],
        package=spec["package"],
        binary=spec.get("binary") or name,
        ldflags=spec.get("ldflags", ""),
        env={str(k): str(v) for k, v in spec.get("env", {}).items()},
        module_dir=module_dir,
        optional=bool(spec.get("optional", False)),
    )


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _override(name: str) -> pathlib.Path | None:
    # ARBITER_TOOL_KUBE_APISERVER=/usr/local/bin/kube-apiserver lets a user bring a binary of their own.
    value = os.environ.get("ARBITER_TOOL_" + name.upper().replace("-", "_"))
    if not value:
        return None
    path = pathlib.Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToolError(f"ARBITER_TOOL_{name.upper().replace('-', '_')}={value} is not an executable file")
    return path


def ensure_tool(name: str, *, quiet: bool = False) -> pathlib.Path:
    """Return the path of tool ``name``'s binary, building it first when it is not cached yet."""
    override = _override(name)
    if override:
        return override
    tool = load_tool(name)
    target = tool.cache_path
    if tool.is_cached():
        return target
    # One builder per tool and version; parallel callers (pytest-xdist workers, two terminals) wait here and find
    # the binary when they get the lock.
    with _locked(cache_root() / ".locks" / f"{tool.name}-{tool.version}.lock"):
        if tool.is_cached():
            return target
        _build(tool, target, quiet=quiet)
        tool.stamp_path.write_text(tool.inputs_digest() + "\n")
    return target


def _build(tool: Tool, target: pathlib.Path, *, quiet: bool) -> None:
    go = shutil.which("go")
    if go is None:
        raise ToolError(
            f"building {tool.name} {tool.version} needs the Go toolchain (>= 1.25) on PATH: "
            "install it from https://go.dev/dl/ or your distribution, or set "
            f"ARBITER_TOOL_{tool.name.upper().replace('-', '_')} to a prebuilt binary"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(tool.env)
    # The tools module pins everything in go.sum; never let a build rewrite it.
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=readonly").strip()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{tool.binary}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    cmd = [go, "build", "-trimpath", "-o", str(tmp)]
    if tool.ldflags:
        cmd += ["-ldflags", tool.ldflags]
    cmd.append(tool.package)
    if not quiet:
        print(
            f"arbiter: building {tool.name} {tool.version} with go build (once; cached in {target.parent})",
            file=sys.stderr,
            flush=True,
        )
    started = time.monotonic()
    try:
        # nice: the build is long and CPU-bound; keep the machine usable for everything else.
        proc = subprocess.run(
            cmd,
            cwd=tool.module_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.nice(10),
        )
        if proc.returncode != 0:
            raise ToolError(
                f"go build of {tool.name} {tool.version} failed (exit {proc.returncode}) in {tool.module_dir}:\n"
                + proc.stdout[-4000:]
            )
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if not quiet:
        print(
            f"arbiter: built {tool.name} in {time.monotonic() - started:.0f}s -> {target}", file=sys.stderr, flush=True
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arbiter_devenv.tools", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or find cached) binaries; all tools when no name is given")
    build.add_argument("names", nargs="*")
    path = sub.add_parser("path", help="print a tool's binary path, building it when missing")
    path.add_argument("name")
    sub.add_parser("list", help="list tools, versions and whether they are cached")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for name in args.names or [n for n in tool_names() if not load_tool(n).optional]:
                started = time.monotonic()
                result = ensure_tool(name)
                print(f"{name}\t{result}\t{time.monotonic() - started:.1f}s")
        elif args.command == "path":
            print(ensure_tool(args.name))
        else:
            for name in tool_names():
                tool = load_tool(name)
                state = "cached" if tool.is_cached() else "not built"
                state += " (optional)" if tool.optional else ""
                print(f"{name}\t{tool.version}\t{state}\t{tool.cache_path}")
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
