"""Checks the apiserver cannot make (CEL in CEL, JSON Schema validity): each problem says what to fix."""

from __future__ import annotations

import jsonschema

from ..api.models import DecisionModelSpec
from ..render.configmap import effective_decision


def _cel_problem(expr: str) -> str | None:
    import celpy  # cel-python: the same CEL dialect the runtime evaluates fallback rules with

    try:
        celpy.Environment().compile(expr)
    except Exception as exc:  # celpy raises its own CELParseError; keep the first line, it names the position
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _prefix_clash(names: list[str]) -> tuple[str, str] | None:
    """A name that is the start of another (the runtime refuses such a list in the compact scored format)."""
    ordered = sorted(names)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b.startswith(a):
                return a, b
    return None


def operator_side_problems(spec: DecisionModelSpec) -> list[str]:
    problems: list[str] = []
    for version in spec.versions:
        for key in ("inputSchema", "outputSchema"):
            schema = getattr(version.metadata, key)
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
                problems.append(
                    f"spec.versions[{version.name}].metadata.{key} is not a valid JSON Schema at {where}: {exc.message}"
                )
        decision = effective_decision(spec.decision, version)
        if decision.trajectoryMode == "scored" and decision.scoredFormat == "compact":
            for key in ("reasoningCodes", "labels"):
                clash = _prefix_clash(getattr(decision, key))
                if clash:
                    problems.append(
                        f"decision.{key} (version {version.name}): {clash[0]!r} is the start of {clash[1]!r}, so "
                        "scoredFormat compact (no separators) cannot tell them apart; rename one, or set "
                        "decision.scoredFormat: lines"
                    )
        for rule in decision.fallbackRules:
            err = _cel_problem(rule.when)
            if err:
                problems.append(
                    f"fallback rule {rule.name!r} (version {version.name}): `when` is not valid CEL: {err}"
                )
    # Report each problem once even when several versions share spec.decision.
    return list(dict.fromkeys(problems))
