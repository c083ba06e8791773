"""The rules fallback: CEL expressions over `input`, `model` and `reason`, compiled at start-up, evaluated in order
(never `eval`).

Variables: `input` is the request document; `model` is the model's result when there is one (a low-confidence
decision: {"decision", "confidence", "trajectory"}) and an empty map when the model produced none, so
`has(model.decision)` tells the two apart; `reason` is why the rules are asked (upstream_down, upstream_error,
deadline, invalid, low_confidence).

CEL is the expression language Kubernetes uses for validation rules; `celpy` (cel-python) is its maintained
Python implementation. A rule matches when its `when` evaluates to the boolean true; an expression that fails at
run time for an input (a missing field, a type mismatch) does not match, is counted and logged by name, and the
next rule is tried. When no rule matches, there is no rules decision (see docs/runtime.md).

Numbers: CEL maps JSON numbers to `double` (google.protobuf.Value), and CEL does not compare int with double, so
every number in the input is a double whatever the caller wrote (`1200` or `1200.0`): rules compare against
double literals (`input.amount > 10000.0`) and get the same answer for both spellings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

from .config import ConfigError, FallbackRule

log = logging.getLogger("arbiter.fallback")


@dataclass(frozen=True)
class RuleDecision:
    rule: str
    decision: str
    reasoning_code: str


def to_cel(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return celpy.json_to_cel(value)
    if isinstance(value, (int, float)):
        return celtypes.DoubleType(float(value))
    if isinstance(value, dict):
        return celtypes.MapType({celtypes.StringType(k): to_cel(v) for k, v in value.items()})
    if isinstance(value, list):
        return celtypes.ListType([to_cel(v) for v in value])
    return celpy.json_to_cel(value)


class RulesEngine:
    def __init__(self, rules: tuple[FallbackRule, ...]):
        env = celpy.Environment()
        self._compiled = []
        for i, rule in enumerate(rules):
            try:
                program = env.program(env.compile(rule.when))
            except Exception as exc:  # celpy raises its own parse error types with the caret position
                raise ConfigError(f"fallbackRules[{i}] ({rule.name}).when is not valid CEL: {exc}") from None
            self._compiled.append((rule, program))
        self.rules = rules
        self.eval_errors = 0

    @property
    def has_default(self) -> bool:
        return bool(self.rules) and self.rules[-1].when.strip() == "true"

    def decide(self, document: Any, model: dict[str, Any] | None = None, reason: str = "") -> RuleDecision | None:
        try:
            cel_input = to_cel(document)
        except Exception as exc:  # cannot happen past input validation (bounded depth, finite numbers); if it
            # does, rules that read the input fail and a catch-all still decides
            self.eval_errors += 1
            log.error("input could not be converted for the rules (%s); rules see an empty input", type(exc).__name__)
            cel_input = celtypes.MapType({})
        activation = {"input": cel_input, "model": to_cel(model or {}), "reason": celtypes.StringType(reason)}
        for rule, program in self._compiled:
            try:
                result = program.evaluate(activation)
            except Exception as exc:  # CELEvalError and friends: this rule does not apply to this input
                self.eval_errors += 1
                log.warning("fallback rule %s could not be evaluated for this input: %s", rule.name,
                            str(exc.args[0]) if exc.args else type(exc).__name__)
                continue
            if isinstance(result, celtypes.BoolType) and bool(result):
                return RuleDecision(rule.name, rule.decision, rule.reasoning_code)
            if isinstance(result, Exception):  # some celpy versions return the error instead of raising
                self.eval_errors += 1
        return None
