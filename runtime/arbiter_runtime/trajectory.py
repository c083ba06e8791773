"""Trajectory schema, trajectory checks and input validation: pure functions over plain data."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from .config import DecisionConfig

# Keywords whose 2020-12 meaning a draft-07 code generator would not enforce; schemas using them (or $ref, whose
# siblings draft-07 ignores) are always validated by jsonschema alone.
_SLOW_ONLY = {"prefixItems", "unevaluatedProperties", "unevaluatedItems", "dependentRequired", "dependentSchemas",
              "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "minContains", "maxContains", "$ref", "$defs",
              "$anchor", "$vocabulary"}


def _keys(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from _keys(v)


class SchemaValidator:
    """JSON Schema 2020-12 via jsonschema, with a compiled fast path that may only *accept*.

    fastjsonschema generates Python code for the schema and checks a valid document ~10-50x faster. Its verdict is
    trusted only when it accepts; a rejection is re-checked by jsonschema, which gives the error (and the final
    say, e.g. on `format`, which jsonschema does not assert). Schemas that use keywords the fast path does not
    know the 2020-12 meaning of never take it.
    """

    def __init__(self, schema: dict[str, Any]):
        self._slow = Draft202012Validator(schema)
        self._fast = None
        if not (_SLOW_ONLY & set(_keys(schema))):
            try:
                import fastjsonschema

                body = {k: v for k, v in schema.items() if k != "$schema"}
                self._fast = fastjsonschema.compile(body)
            except Exception:  # not installed, or a schema it cannot compile: jsonschema alone
                self._fast = None

    def first_error(self, document: Any) -> jsonschema.ValidationError | None:
        if self._fast is not None:
            try:
                self._fast(document)
                return None
            except Exception:  # JsonSchemaValueException, or anything odd: let jsonschema decide
                pass
        return jsonschema.exceptions.best_match(self._slow.iter_errors(document))


def derived_output_schema(cfg: DecisionConfig) -> dict[str, Any]:
    """The trajectory schema the runtime writes (scored) or asks the model to write (generated)."""
    prob = {"type": "number", "minimum": 0, "maximum": 1}
    step = {
        "type": "object",
        "properties": {
            "step": {"type": "integer", "minimum": 1, "maximum": cfg.steps},
            "reasoningCode": {"type": "string", "enum": list(cfg.reasoning_codes)},
            "label": {"type": "string", "enum": list(cfg.labels)},
            "probabilities": {
                "type": "object",
                "properties": {label: prob for label in cfg.labels},
                "required": list(cfg.labels),
                "additionalProperties": False,
            },
            "confidence": prob,
        },
        "required": ["step", "reasoningCode", "probabilities", "confidence"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"steps": {"type": "array", "items": step, "minItems": cfg.steps, "maxItems": cfg.steps}},
        "required": ["steps"],
        "additionalProperties": False,
    }


class TrajectoryInvalid(ValueError):
    """The model's answer cannot be used; `kind` feeds metrics ("schema", "probabilities", "order", ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _path(error: jsonschema.ValidationError) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")


class TrajectoryChecker:
    """Checks every trajectory: output schema(s), probabilities, step order. Build once per config."""

    def __init__(self, cfg: DecisionConfig):
        self.cfg = cfg
        self.schema = derived_output_schema(cfg)
        self._validators = [SchemaValidator(self.schema)]
        if cfg.output_schema:
            self._validators.append(SchemaValidator(cfg.output_schema))
        self.tol = cfg.probability_tolerance

    def check(self, trajectory: Any) -> None:
        for validator in self._validators:
            error = validator.first_error(trajectory)
            if error is not None:
                where = _path(error) or "(root)"
                raise TrajectoryInvalid("schema", f"trajectory does not match the output schema at {where}: "
                                                  f"{error.message}")
        steps = trajectory["steps"]
        labels = self.cfg.labels
        for i, step in enumerate(steps):
            if step["step"] != i + 1:
                raise TrajectoryInvalid("order", f"steps out of order: position {i + 1} holds step {step['step']}")
            probs = step["probabilities"]
            total = 0.0
            for label in labels:
                p = probs[label]
                if not (isinstance(p, (int, float)) and math.isfinite(p) and 0.0 <= p <= 1.0):
                    raise TrajectoryInvalid("probabilities", f"step {i + 1}: probability of {label} is {p!r}")
                total += p
            if abs(total - 1.0) > self.tol:
                raise TrajectoryInvalid("probabilities",
                                        f"step {i + 1}: probabilities sum to {total:.6f}, not 1 (tolerance "
                                        f"{self.tol})")
            # The stated label and confidence must be what the step's own probabilities say.
            top = max(probs[label] for label in labels)
            if abs(step["confidence"] - top) > self.tol:
                raise TrajectoryInvalid("inconsistent", f"step {i + 1}: confidence {step['confidence']!r} but the "
                                                        f"largest probability is {top:.6f}")
            stated = step.get("label")
            if stated is not None and probs[stated] < top - self.tol:
                raise TrajectoryInvalid("inconsistent", f"step {i + 1}: label {stated} has probability "
                                                        f"{probs[stated]:.6f}, below the largest ({top:.6f})")

    def decide(self, trajectory: dict[str, Any]) -> tuple[str, float]:
        """Decision = the last step's label, else its argmax (ties: first label in config order); confidence = its
        probability."""
        last = trajectory["steps"][-1]
        probs = last["probabilities"]
        # The stated label, when there is one, is the decision (check() made sure it is an argmax within the
        # tolerance), so the decision never contradicts what the model wrote.
        best = last.get("label") or max(self.cfg.labels, key=lambda label: probs[label])
        return best, float(probs[best])


class InputInvalid(ValueError):
    """The request does not match the input schema; the message names the field."""


class InputValidator:
    def __init__(self, schema: dict[str, Any]):
        self._validator = SchemaValidator(schema) if schema else None

    def check(self, document: Any) -> None:
        if self._validator is None:
            if not isinstance(document, dict):
                raise InputInvalid(f"input must be a JSON object, got {type(document).__name__}")
            return
        error = self._validator.first_error(document)
        if error is not None:
            field = _path(error)
            # A missing property is reported on its parent; name the property itself.
            if error.validator == "required" and isinstance(error.instance, dict):
                missing = [k for k in error.validator_value if k not in error.instance]
                if missing:
                    field = f"{field}.{missing[0]}" if field else missing[0]
            raise InputInvalid(f"field '{field or '(root)'}': {error.message}")
