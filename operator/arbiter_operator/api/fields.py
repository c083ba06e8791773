"""The building blocks of the DecisionModel API's models: bounded strings, the JSON Schema field, CEL rules, the base
model.

Every list and string carries a bound: the apiserver estimates the cost of CEL rules from them and refuses a CRD whose
rules could run unbounded. Cross-field rules are CEL (`x-kubernetes-validations`) next to the fields they guard, so
the apiserver rejects bad input with a message that says what to write instead. The underscored helpers serve the
api package's model modules only.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints
from pydantic.json_schema import JsonDict  # type: ignore[attr-defined]  # pydantic defines it, exports none

Name = Annotated[str, StringConstraints(min_length=1, max_length=63)]
ShortStr = Annotated[str, StringConstraints(max_length=256)]
LongStr = Annotated[str, StringConstraints(max_length=4096)]
Arg = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# How deep an inputSchema or outputSchema may nest (objects and arrays, the schema itself counting as one). A JSON
# Schema of a real request or trajectory nests a few levels (each property adds two: `properties`, then the property's
# schema); the apiserver admits 10,000, deeper than the operator's JSON libraries go (orjson writes 255 levels, reads
# 1,024). The CRD cannot refuse it (CEL has no recursion, and may not read a member of a preserve-unknown-fields
# object at all: the apiserver refuses such a rule), so the operator does, as InvalidSpec (docs/user-guide.md "Limits").
MAX_SCHEMA_DEPTH = 64


def schema_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """How deep `value` nests (a scalar: 0, `{}`: 1), counted iteratively (no recursion on hostile input) and only up
    to `limit` + 1: beyond that the answer is "too deep"."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _not_too_deep(schema: dict[str, Any]) -> dict[str, Any]:
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"nested deeper than {MAX_SCHEMA_DEPTH} levels, the most the operator accepts: a JSON Schema "
                         "that deep describes no real document")
    return schema


JsonSchemaObject = Annotated[dict[str, Any], AfterValidator(_not_too_deep)]


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _rules(*rules: JsonDict) -> JsonDict:
    """A field's CEL rules (the schema's x-kubernetes-validations), for its json_schema_extra."""
    return {"x-kubernetes-validations": list(rules)}


def _checked(*rules: JsonDict) -> ConfigDict:
    """The config of an object whose schema carries CEL rules across its fields."""
    return ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=_rules(*rules))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

