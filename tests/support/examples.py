"""The examples/ a user starts from, loaded fresh for every caller (tests mutate what they get)."""

from __future__ import annotations

from typing import Any

import yaml

from support.paths import REPO

ROOT = REPO
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "decisionmodel.yaml"


def example_text(name: str = "decisionmodel.yaml") -> str:
    return (EXAMPLES / name).read_text()


def example(name: str = "decisionmodel.yaml") -> dict[str, Any]:
    """examples/<name> as a new dict (a DecisionModel manifest for the default)."""
    return yaml.safe_load(example_text(name))
