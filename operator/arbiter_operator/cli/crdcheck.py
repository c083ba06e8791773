"""What the apiserver does to a DecisionModel at `oc apply`, offline: strict decoding (unknown fields), defaulting,
the structural schema's validation and the CRD's CEL rules, with the apiserver's own messages.

The schema is the CRD's, made by `api.crdgen` from the pydantic models (the one source of truth), so a rule added to
the API is checked here without a change. The messages follow kube-apiserver 1.34 to the letter (field path, error
type, value, detail), so `lint` says what `oc apply` would say; a cluster test compares the two on every bad-spec
case the CRD rejects. Order follows the apiserver too: the schema's errors, then list uniqueness, then CEL unless a
blocking error (a wrong type, a missing required field, a value outside an enum, too long, too many) stopped it.

Why not a library: no Python package validates Kubernetes structural schemas with the apiserver's messages
(jsonschema speaks JSON Schema's words and knows neither x-kubernetes-list-type nor CEL); the translation of the
handful of keywords the CRD uses is below. CEL is evaluated by cel-python, as the operator's own checks do, with the
Kubernetes string function the rules use (`replace`) added.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from ..api import crdgen

OMIT = object()

# The metadata fields a Kubernetes object may carry (ObjectMeta, as strict decoding knows them).
OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields"})
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_MESSAGE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_BLOCKING = frozenset({"Unsupported value", "Required value", "Too long", "Too many", "TypeInvalid"})


def go_value(value: Any) -> str:
    """A value as Go's field errors print it (`%v` for numbers and booleans, `%q` for strings, JSON otherwise)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@dataclass(frozen=True)
class FieldError:
    """One apiserver field error: `<field>: <type>[: <value>][: <detail>]`."""

    field: str
    type: str  # Required value, Invalid value, Unsupported value, Duplicate value, Too long, Too many, Forbidden
    detail: str = ""
    value: Any = OMIT
    blocking: bool = False

    def __str__(self) -> str:
        body = self.type
        if self.type in ("Invalid value", "Unsupported value", "Duplicate value", "Too many") and \
                self.value is not OMIT:
            body += f": {go_value(self.value)}"
        return f"{self.field}: {body}" + (f": {self.detail}" if self.detail else "")


@functools.cache
def schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema, from the models (what the generated CRD file holds)."""
    return crdgen.openapi_schema()


# -- strict decoding, nulls, defaults -------------------------------------------------------------------------------


def unknown_fields(obj: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare (kubectl's default strict field validation refuses them)."""
    found: list[str] = []
    if isinstance(obj, dict) and node.get("type") == "object":
        props = node.get("properties")
        if path == ".metadata":
            return [f"metadata.{k}" for k in obj if k not in OBJECT_META_FIELDS]
        for key, value in obj.items():
            sub = (props or {}).get(key)
            if sub is not None:
                found += unknown_fields(value, sub, f"{path}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                found += unknown_fields(value, node["additionalProperties"], f"{path}.{key}")
            elif props is not None and not node.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}".lstrip("."))
    elif isinstance(obj, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown_fields(item, node["items"], f"{path}[{i}]")
    return found


def default(obj: Any, node: dict[str, Any]) -> Any:
    """The apiserver's structural defaulting: nulls of non-nullable fields dropped, missing fields with a default
    set to it (a copy), top down, so a defaulted `{}` gets its own fields' defaults."""
    if isinstance(obj, dict) and node.get("type") == "object":
        props = node.get("properties") or {}
        for key in [k for k, v in obj.items() if v is None and not (props.get(k) or {}).get("nullable")]:
            del obj[key]
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = default(obj[key], sub)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                obj[key] = default(obj[key], extra)
    elif isinstance(obj, list) and isinstance(node.get("items"), dict):
        return [default(item, node["items"]) for item in obj]
    return obj


# -- the structural schema ------------------------------------------------------------------------------------------

_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _type_of(value: Any) -> str:
    return "null" if value is None else _JSON_TYPE.get(type(value), type(value).__name__)


def _type_ok(value: Any, wanted: str) -> bool:
    actual = _type_of(value)
    return actual == wanted or (wanted == "number" and actual == "integer")


def validate(value: Any, node: dict[str, Any], path: str) -> list[FieldError]:
    """kube-openapi's validation of one node and its children, as the apiserver reports it."""
    name = path.lstrip(".")
    wanted = node.get("type")
    if wanted and not _type_ok(value, wanted):
        # kube-openapi reports the type it found as the invalid value, not the value itself.
        return [FieldError(name, "Invalid value", f"{name} in body must be of type {wanted}: "
                           f"{json.dumps(_type_of(value))}", _type_of(value), blocking=True)]
    errors: list[FieldError] = []
    if isinstance(value, dict):
        errors += _object(value, node, path)
    elif isinstance(value, list):
        errors += _array(value, node, path)
    elif isinstance(value, str):
        errors += _string(value, node, name)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        errors += _number(value, node, name)
    if "enum" in node and value not in node["enum"]:
        allowed = [v if isinstance(v, str) else json.dumps(v) for v in node["enum"]]
        errors.append(FieldError(name, "Unsupported value", "supported values: " +
                                 ", ".join(json.dumps(v) for v in allowed), value, blocking=True))
    return errors


def _object(value: dict[str, Any], node: dict[str, Any], path: str) -> list[FieldError]:
    errors = [FieldError(f"{path}.{key}".lstrip("."), "Required value", blocking=True)
              for key in node.get("required") or [] if key not in value]
    props = node.get("properties") or {}
    for key, sub in props.items():
        if key in value:
            errors += validate(value[key], sub, f"{path}.{key}")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key, item in value.items():
            if key not in props:
                errors += validate(item, extra, f"{path}.{key}")
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        errors.append(FieldError(path.lstrip("."), "Too many", f"must have at most {node['maxProperties']} items",
                                 len(value), blocking=True))
    return errors


def _array(value: list[Any], node: dict[str, Any], path: str) -> list[FieldError]:
    name = path.lstrip(".")
    errors: list[FieldError] = []
    if "maxItems" in node and len(value) > node["maxItems"]:
        word = "item" if node["maxItems"] == 1 else "items"
        errors.append(FieldError(name, "Too many", f"must have at most {node['maxItems']} {word}", len(value),
                                 blocking=True))
    if "minItems" in node and len(value) < node["minItems"]:
        errors.append(FieldError(name, "Invalid value", f"{name} in body should have at least {node['minItems']} "
                                 "items", len(value)))  # the apiserver prints the count, not the list
    if isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            errors += validate(item, node["items"], f"{path}[{i}]")
    return errors


def _string(value: str, node: dict[str, Any], name: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if "maxLength" in node and len(value) > node["maxLength"]:
        word = "byte" if node["maxLength"] == 1 else "bytes"
        errors.append(FieldError(name, "Too long", f"may not be more than {node['maxLength']} {word}",
                                 blocking=True))
    if "minLength" in node and len(value) < node["minLength"]:
        errors.append(FieldError(name, "Invalid value", f"{name} in body should be at least {node['minLength']} "
                                 "chars long", value))
    if "pattern" in node and not re.search(node["pattern"], value):
        errors.append(FieldError(name, "Invalid value", f"{name} in body should match '{node['pattern']}'", value))
    return errors


def _number(value: float, node: dict[str, Any], name: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if "maximum" in node:
        top, exclusive = node["maximum"], node.get("exclusiveMaximum") is True
        if value > top or (exclusive and value == top):
            words = "less than" if exclusive else "less than or equal to"
            errors.append(FieldError(name, "Invalid value", f"{name} in body should be {words} {go_value(top)}",
                                     value))
    if "minimum" in node:
        low, exclusive = node["minimum"], node.get("exclusiveMinimum") is True
        if value < low or (exclusive and value == low):
            words = "greater than" if exclusive else "greater than or equal to"
            errors.append(FieldError(name, "Invalid value", f"{name} in body should be {words} {go_value(low)}",
                                     value))
    return errors


def list_duplicates(value: Any, node: dict[str, Any], path: str) -> list[FieldError]:
    """x-kubernetes-list-type map (unique keys) and set (unique items): the apiserver's Duplicate value errors."""
    errors: list[FieldError] = []
    if isinstance(value, dict) and node.get("type") == "object":
        for key, sub in (node.get("properties") or {}).items():
            if key in value:
                errors += list_duplicates(value[key], sub, f"{path}.{key}")
    elif isinstance(value, list):
        kind, keys = node.get("x-kubernetes-list-type"), node.get("x-kubernetes-list-map-keys") or []
        seen: list[Any] = []  # keys seen so far (a list: a key may be a dict)
        for i, item in enumerate(value):
            ident: Any = None
            if kind == "map" and isinstance(item, dict):
                ident = {k: item[k] for k in keys if k in item}
            elif kind == "set":
                ident = item
            if ident is not None:
                if ident in seen:
                    errors.append(FieldError(f"{path}[{i}]".lstrip("."), "Duplicate value", value=ident))
                seen.append(ident)
        if isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                errors += list_duplicates(item, node["items"], f"{path}[{i}]")
    return errors


def metadata_errors(meta: Any) -> list[FieldError]:
    """ObjectMeta's own validation of a namespaced custom resource's name."""
    if not isinstance(meta, dict):
        return [FieldError("metadata", "Required value")]
    name = meta.get("name")
    if not name and not meta.get("generateName"):
        return [FieldError("metadata.name", "Required value", "name or generateName is required")]
    if isinstance(name, str) and name:
        if len(name) > 253:
            return [FieldError("metadata.name", "Invalid value", "must be no more than 253 characters", name)]
        if not _DNS1123_SUBDOMAIN.match(name):
            return [FieldError("metadata.name", "Invalid value", _DNS1123_MESSAGE, name)]
    return []


def check(manifest: dict[str, Any]) -> tuple[list[FieldError], list[str], dict[str, Any]]:
    """(field errors as the apiserver reports them, unknown fields, the object as defaulted) for one DecisionModel."""
    from .cel_rules import cel_errors

    root = schema()
    unknown = unknown_fields(manifest, root)
    obj = default(copy.deepcopy(manifest), root)
    errors = metadata_errors(obj.get("metadata"))
    errors += validate(obj, root, "")
    errors += list_duplicates(obj, root, "")
    if any(e.blocking for e in errors):
        errors.append(FieldError("<nil>", "Invalid value", "some validation rules were not checked because the "
                                 "object was invalid; correct the existing errors to complete validation", None))
    else:
        errors += cel_errors(obj, root)
    return errors, unknown, obj
