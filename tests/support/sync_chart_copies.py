"""Refresh the two copies the chart tests hold to their sources: crds/ -> helm/arbiter/crds/, and the Argo CD health
check (helm/arbiter/health/decisionmodel.lua) -> the argocd-cm snippet in docs/install.md.

    .venv/bin/python tests/support/sync_chart_copies.py
"""

from __future__ import annotations

import pathlib
import re
import shutil

REPO = pathlib.Path(__file__).resolve().parents[2]
BEGIN = "  resource.customizations.health.arbiter.dev_DecisionModel: |\n"


def main() -> None:
    chart_crds = REPO / "helm" / "arbiter" / "crds"
    for old in chart_crds.glob("*.yaml"):
        old.unlink()
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        shutil.copyfile(crd, chart_crds / crd.name)

    lua = (REPO / "helm" / "arbiter" / "health" / "decisionmodel.lua").read_text().strip("\n")
    block = "\n".join(("    " + line) if line else "" for line in lua.splitlines())
    install = REPO / "docs" / "install.md"
    text = install.read_text()
    # The snippet runs from the data key to the closing code fence.
    pattern = re.compile(re.escape(BEGIN) + r".*?\n```", re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs/install.md has no line {BEGIN.strip()!r} followed by a code block")
    install.write_text(pattern.sub(lambda _m: BEGIN + block + "\n```", text, count=1))


if __name__ == "__main__":
    main()
