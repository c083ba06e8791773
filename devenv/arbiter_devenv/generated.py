"""Files the repository generates (the OLM bundle and catalog, the dashboards): written, or checked for drift."""

from __future__ import annotations

import difflib
import pathlib
import sys

from arbiter_devenv.tools import repo_root


def write_or_check(files: dict[str, str], check: bool, command: str, root: pathlib.Path | None = None) -> int:
    """Write each file (path relative to the repository: its text) that differs; with `check`, write nothing and
    print the diff instead, returning 1 when any differs (`command` is what regenerates them)."""
    root = root or repo_root()
    drift = False
    for rel, text in files.items():
        path = root / rel
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if check:
            drift = True
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), rel,
                                                       "generated"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {rel}")
    if drift:
        print(f"\ngenerated files are out of date: run {command}", file=sys.stderr)
        return 1
    return 0
