"""The Model Registry's typed custom properties (`MetadataValue`): plain values to the wire form and back (pure)."""

from __future__ import annotations

import base64
import json
from typing import Any


def string_value(value: str) -> dict[str, str]:
    return {"metadataType": "MetadataStringValue", "string_value": value}


def int_value(value: int) -> dict[str, str]:
    # int64 travels as a string in the registry's OpenAPI document.
    return {"metadataType": "MetadataIntValue", "int_value": str(int(value))}


def double_value(value: float) -> dict[str, Any]:
    return {"metadataType": "MetadataDoubleValue", "double_value": float(value)}


def bool_value(value: bool) -> dict[str, Any]:
    return {"metadataType": "MetadataBoolValue", "bool_value": bool(value)}


def to_custom_properties(values: dict[str, str | int | float | bool]) -> dict[str, dict[str, Any]]:
    """Plain Python values -> the registry's typed `MetadataValue` map."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if isinstance(value, bool):  # before int: bool is an int
            out[key] = bool_value(value)
        elif isinstance(value, int):
            out[key] = int_value(value)
        elif isinstance(value, float):
            out[key] = double_value(value)
        else:
            out[key] = string_value(str(value))
    return out


def from_metadata_value(value: dict[str, Any]) -> Any:
    kind = value.get("metadataType")
    if kind == "MetadataStringValue":
        return value.get("string_value", "")
    if kind == "MetadataIntValue":
        return int(value.get("int_value", "0"))
    if kind == "MetadataDoubleValue":
        return float(value.get("double_value", 0.0))
    if kind == "MetadataBoolValue":
        return bool(value.get("bool_value", False))
    if kind == "MetadataStructValue":
        raw = value.get("struct_value", "")
        try:
            return json.loads(base64.b64decode(raw))
        except ValueError:
            return raw
    return value  # MetadataProtoValue and unknown kinds stay as sent


def from_custom_properties(props: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    return {k: from_metadata_value(v) for k, v in (props or {}).items()}
