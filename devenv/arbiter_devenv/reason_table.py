"""The operator's reason tables in docs/operations.md, copied for `kubectl arbiter diagnose` (which ships without the
docs): each condition reason, what happened and what to do.

    python -m arbiter_devenv.reason_table           # write operator/arbiter_operator/cli/diagnose/reasons.json
    python -m arbiter_devenv.reason_table --check   # exit 1 when the copy differs from the docs

The docs are the one source: a row edited there reaches the plugin by this generator, and a drift test fails until
it is run. Two tables are read: "Reasons and what to do" (conditions) and the promotion's reasons under
"Conditions and reasons".
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from arbiter_devenv.generated import write_or_check
from arbiter_devenv.tools import repo_root

DOCS = "docs/operations.md"
OUTPUT = "operator/arbiter_operator/cli/diagnose/reasons.json"
TABLES = ("| condition / reason | what happened | what to do |", "| reason | what happened | what to do |")
_REASON = re.compile(r"^[A-Z][A-Za-z]+$")
_CONDITION = re.compile(r"^([A-Za-z]+)=(True|False|Unknown)$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _plain(text: str) -> str:
    return re.sub(r"\*\*(.+?)\*\*", r"\1", text).strip()


def rows(markdown: str) -> list[dict[str, str]]:
    """Every row of the reason tables: condition (e.g. Stalled=True, may be empty), reason, when (the words after
    the reason in the first cell), what happened, what to do."""
    out: list[dict[str, str]] = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if line.strip() not in TABLES:
            continue
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = _cells(row)
            if len(cells) != 3:
                continue
            ticked = re.findall(r"`([^`]+)`", cells[0])
            reasons = [t for t in ticked if _REASON.match(t)]
            if not reasons:
                continue
            condition = next((t for t in ticked if _CONDITION.match(t)), "")
            when = cells[0]
            for token in (condition, reasons[-1]):
                when = when.replace(f"`{token}`", "") if token else when
            when = when.replace("`", "").strip(" ,")
            out.append({"condition": condition, "reason": reasons[-1], "when": when,
                        "happened": _plain(cells[1]), "todo": _plain(cells[2])})
    return out


def render() -> dict[str, str]:
    table = rows((repo_root() / DOCS).read_text())
    return {OUTPUT: json.dumps({"source": DOCS, "rows": table}, indent=1, ensure_ascii=False) + "\n"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the copy differs from the docs")
    args = p.parse_args(argv)
    return write_or_check(render(), args.check, "python -m arbiter_devenv.reason_table", repo_root())


if __name__ == "__main__":
    sys.exit(main())
