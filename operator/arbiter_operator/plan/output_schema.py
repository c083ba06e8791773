"""Does a version's `outputSchema` admit any trajectory its decision settings can produce?

The runtime validates every trajectory against the schema it derives from the decision settings (`{"steps": [...]}`,
one entry per step with `step`, `reasoningCode`, optional `label`, `probabilities` over every label and
`confidence`) AND against the version's `outputSchema`. A schema written for another document shape (say, requiring
`decision` at the top) rejects every answer, so every request would end in the rules fallback while the status says
Ready. Deciding whether two JSON Schemas intersect is hard in general; instead a set of witness trajectories is built
from the settings (every label as the decision, every reasoning code, one-hot / leaning / uniform probabilities, with
and without the optional `label` key) and the schema must accept at least one. When none passes, the message names
what the schema asked for, from the witness closest to passing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema

from ..api.models import DecisionSpec


def _probabilities(labels: list[str], winner: str, shape: str) -> dict[str, float]:
    n = len(labels)
    if shape == "onehot":
        return {lab: (1.0 if lab == winner else 0.0) for lab in labels}
    if shape == "uniform":
        return {lab: 1.0 / n for lab in labels}
    rest = 0.2 / (n - 1)
    return {lab: (0.8 if lab == winner else rest) for lab in labels}


def witnesses(decision: DecisionSpec) -> Iterator[dict[str, Any]]:
    labels, codes = list(decision.labels), list(decision.reasoningCodes)
    for shape in ("lean", "onehot", "uniform"):
        for winner in labels:
            for code in codes:
                for with_label in (True, False):
                    probs = _probabilities(labels, winner, shape)
                    best = max(labels, key=lambda lab: probs[lab])
                    steps = []
                    for n in range(1, decision.steps + 1):
                        step: dict[str, Any] = {"step": n, "reasoningCode": code, "probabilities": dict(probs),
                                                "confidence": probs[best]}
                        if with_label:
                            step["label"] = best
                        steps.append(step)
                    yield {"steps": steps}


def output_schema_clash(schema: dict[str, Any], decision: DecisionSpec) -> str | None:
    """None when some trajectory of these settings passes `schema`; else what the schema requires that none has."""
    if not schema:
        return None
    validator = jsonschema.Draft202012Validator(schema)
    closest: tuple[int, jsonschema.ValidationError] | None = None
    for trajectory in witnesses(decision):
        errors = list(validator.iter_errors(trajectory))
        if not errors:
            return None
        if closest is None or len(errors) < closest[0]:
            closest = (len(errors), jsonschema.exceptions.best_match(errors))
    assert closest is not None
    error = closest[1]
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return (f"rejects every trajectory the decision settings produce (at {where}: {error.message}); outputSchema "
            f"constrains the trajectory document {{\"steps\": [{{\"step\", \"reasoningCode\", \"label\", "
            f"\"probabilities\", \"confidence\"}}, ...]}} with {decision.steps} step(s), labels "
            f"{list(decision.labels)} and reasoning codes {list(decision.reasoningCodes)}")
