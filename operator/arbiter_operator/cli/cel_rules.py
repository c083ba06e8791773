"""The CRD's CEL rules (`x-kubernetes-validations`), evaluated offline as the apiserver evaluates them.

Each rule runs with `self` bound to the node it sits on, for every node the object has (each item of a list); a
failed rule is the apiserver's `field.Invalid(path, <schema type>, message)`, or the error its `reason` names, at its
`fieldPath` when it has one. At the root the path is `<nil>`, as the apiserver prints a nil field path. Values are
converted by the schema's types (a `number` is a double even when written as 1), as the apiserver's CEL sees them.
"""

from __future__ import annotations

import functools
from typing import Any

from .crdcheck import FieldError

_REASONS = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required value",
            "FieldValueDuplicate": "Duplicate value", "FieldValueInvalid": "Invalid value"}


@functools.cache
def _environment() -> Any:
    import celpy

    return celpy.Environment()


@functools.cache
def _program(rule: str) -> Any:
    import celpy

    env = _environment()

    def replace(text: Any, old: Any, new: Any) -> Any:  # Kubernetes' strings library: <string>.replace(a, b)
        return celpy.celtypes.StringType(str(text).replace(str(old), str(new)))

    return env.program(env.compile(rule), functions={"replace": replace})


def _to_cel(value: Any, node: dict[str, Any]) -> Any:
    from celpy import celtypes

    if isinstance(value, dict):
        props = node.get("properties") or {}
        extra: dict[str, Any] = node["additionalProperties"] if isinstance(node.get("additionalProperties"), dict) \
            else {}
        return celtypes.MapType({celtypes.StringType(k): _to_cel(v, props.get(k) or extra or {})
                                 for k, v in value.items()})
    if isinstance(value, list):
        item: dict[str, Any] = node["items"] if isinstance(node.get("items"), dict) else {}
        return celtypes.ListType([_to_cel(v, item) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int) and node.get("type") != "number":
        return celtypes.IntType(value)
    if isinstance(value, (int, float)):
        return celtypes.DoubleType(float(value))
    if isinstance(value, str):
        return celtypes.StringType(value)
    return None


def _child(path: str, field_path: str) -> str:
    joined = (path if path != "<nil>" else "") + field_path
    return joined.lstrip(".") or "<nil>"


def _evaluate(rule: dict[str, Any], value: Any, node: dict[str, Any], path: str) -> FieldError | None:
    text = rule["rule"]
    at = _child(path, rule.get("fieldPath", ""))
    try:
        result = _program(text).evaluate({"self": _to_cel(value, node)})
    except Exception as exc:  # an evaluation error fails the rule, as in the apiserver
        return FieldError(at, "Invalid value", f"{text}: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                          node.get("type", "object"))
    if isinstance(result, Exception):
        return FieldError(at, "Invalid value", f"{text}: {result}", node.get("type", "object"))
    if bool(result):
        return None
    message = (rule.get("message") or "").strip() or f"failed rule: {text.strip()}"
    kind = _REASONS.get(rule.get("reason") or "", "Invalid value")
    if kind in ("Forbidden", "Required value"):
        return FieldError(at, kind, message)
    return FieldError(at, kind, message, node.get("type", "object"))


def cel_errors(value: Any, node: dict[str, Any], path: str = "<nil>") -> list[FieldError]:
    errors = []
    for rule in node.get("x-kubernetes-validations") or []:
        found = _evaluate(rule, value, node, path)
        if found is not None:
            errors.append(found)
    if isinstance(value, dict):
        for key, sub in (node.get("properties") or {}).items():
            if key in value:
                errors += cel_errors(value[key], sub, _child(path, f".{key}"))
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(item, node["items"], f"{path}[{i}]")
    return errors
