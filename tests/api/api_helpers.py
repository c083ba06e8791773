from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from arbiter_operator.api.models import DecisionModel

ROOT = Path(__file__).resolve().parents[2]


def example(name: str = "decisionmodel.yaml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def make_dm(raw: dict[str, Any] | None = None, **meta: Any) -> DecisionModel:
    raw = copy.deepcopy(raw or example())
    raw["metadata"].setdefault("namespace", "team-a")
    raw["metadata"].setdefault("uid", "0000-uid")
    raw["metadata"].setdefault("generation", 1)
    raw["metadata"].update(meta)
    return DecisionModel.model_validate(raw)

