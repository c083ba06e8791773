"""The example's decision model for the GPU-less local run: how a model fine-tuned on examples/decisionmodel.yaml's
credit-limit cases answers, written as the policy it was trained on, so the stand-in (vllm_standin.py, `planner`)
writes trajectories that agree with the example's own reasoning codes and labels.

Three steps, one question each, as the example's `steps: 3` asks:
1. affordability: the requested limit against the income (up to a quarter INCOME_OK, approved; up to half
   DEBT_RATIO_HIGH, review; more DEBT_RATIO_HIGH, rejected);
2. history: under two years (or none) HISTORY_THIN, review; otherwise step 1 stands;
3. the limit itself: above 50,000 LIMIT_TOO_HIGH, review at least (what the example's fallback rule says too);
   otherwise the most cautious label so far, with its code.
Each step is surer than the one before (the model has read more of the case), so the probabilities move along the
trajectory instead of repeating. Not a product part: devenv only.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

LABELS = ("approved", "rejected", "review")
CODES = frozenset({"INCOME_OK", "DEBT_RATIO_HIGH", "HISTORY_THIN", "LIMIT_TOO_HIGH"})
CAUTION = {"approved": 0, "review": 1, "rejected": 2}
CONFIDENCE = (0.86, 0.91, 0.94)  # per step: the chosen label's probability


def _number(case: dict[str, Any], key: str) -> float:
    value = case.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _years(history: str) -> float:
    """'7y, no defaults' -> 7; '18 months' -> 1.5; nothing readable -> 0."""
    found = re.search(r"(\d+(?:\.\d+)?)\s*(y|yr|year|m|mo|month)", history.lower())
    if not found:
        return 0.0
    value = float(found.group(1))
    return value / 12 if found.group(2).startswith("m") else value


def steps(case: dict[str, Any]) -> list[tuple[str, str]]:
    """(reasoning code, label) per step for one credit-limit case."""
    income, limit = _number(case, "income"), _number(case, "requestedLimit")
    ratio = limit / income if income > 0 else math.inf
    if ratio <= 0.25:
        first = ("INCOME_OK", "approved")
    elif ratio <= 0.5:
        first = ("DEBT_RATIO_HIGH", "review")
    else:
        first = ("DEBT_RATIO_HIGH", "rejected")
    history = case.get("history") if isinstance(case.get("history"), str) else ""
    second = ("HISTORY_THIN", "review") if _years(history) < 2 else first
    cautious = max(first, second, key=lambda s: CAUTION[s[1]])
    third = ("LIMIT_TOO_HIGH", max("review", cautious[1], key=CAUTION.__getitem__)) if limit > 50000 else cautious
    return [first, second, third]


def distribution(label: str, confidence: float) -> dict[str, float]:
    rest = (1 - confidence) / (len(LABELS) - 1)
    return {x: confidence if x == label else rest for x in LABELS}


def plan(messages: list[Any]) -> list[tuple[str, dict[str, float]]] | None:
    """The stand-in's planner: the case is the user message (the runtime sends the input document as JSON)."""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            try:
                case = json.loads(message.get("content") or "")
            except (TypeError, ValueError):
                return None
            if isinstance(case, dict):
                return [(code, distribution(label, CONFIDENCE[min(i, len(CONFIDENCE) - 1)]))
                        for i, (code, label) in enumerate(steps(case))]
    return None
