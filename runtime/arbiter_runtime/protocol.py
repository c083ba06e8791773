"""KServe V2 (Open Inference Protocol) REST bodies: parsing the infer request, building the response. Pure.

The input is one BYTES tensor whose elements are JSON documents written as UTF-8 strings (the JSON form of
BYTES; base64 is not part of it). Shape [N] or [N, 1]; `data` flat or nested one level per the spec.
"""

from __future__ import annotations

import json
from typing import Any

from .jsonutil import dumps

MAX_ROWS = 256


class BadRequest(ValueError):
    """400 with this message."""


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def loads_strict(text: str | bytes) -> Any:
    """Inputs are parsed by the standard library: exact integers (no 64-bit limit), no NaN/Infinity."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite)


def parse_infer(body: Any) -> tuple[list[Any], str | None, list[str] | None]:
    """Return (documents, request id, requested output names) or raise BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object with 'inputs'")
    req_id = body.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest("'id' must be a string")
    if req_id is not None:
        try:
            req_id.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("'id' is not valid Unicode (a lone surrogate); send UTF-8 text") from None
    params = body.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        raise BadRequest("'inputs' must hold exactly one tensor (a BYTES tensor of JSON documents)")
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise BadRequest("inputs[0] must be a tensor object with name, shape, datatype, data")
    name = tensor.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("inputs[0].name must be a non-empty string")
    if tensor.get("datatype") != "BYTES":
        raise BadRequest(f"inputs[0].datatype must be BYTES (JSON documents as UTF-8 strings), "
                         f"got {tensor.get('datatype')!r}")
    shape = tensor.get("shape")
    if (not isinstance(shape, list) or not shape or len(shape) > 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or (len(shape) == 2 and shape[1] != 1)):
        raise BadRequest("inputs[0].shape must be [N] or [N, 1]")
    rows = shape[0]
    if rows == 0:
        raise BadRequest("inputs[0] has no rows")
    if rows > MAX_ROWS:
        raise BadRequest(f"inputs[0] has {rows} rows; at most {MAX_ROWS} per request")
    data = tensor.get("data")
    if not isinstance(data, list):
        raise BadRequest("inputs[0].data must be a list of strings")
    flat: list[Any] = []
    for item in data:
        if isinstance(item, list):
            flat.extend(item)
        else:
            flat.append(item)
    if len(flat) != rows:
        raise BadRequest(f"inputs[0].data has {len(flat)} elements but shape says {rows}")
    documents = []
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise BadRequest(f"inputs[0].data[{i}] must be a string holding a JSON document, got "
                             f"{type(item).__name__}")
        try:
            documents.append(loads_strict(item))
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"inputs[0].data[{i}] is not a JSON document: {exc}") from None
    outputs = body.get("outputs")
    wanted = None
    if outputs is not None:
        if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                    for o in outputs):
            raise BadRequest("'outputs' must be a list of {name}")
        wanted = [o["name"] for o in outputs]
        unknown = sorted(set(wanted) - set(OUTPUT_NAMES))
        if unknown:
            raise BadRequest(f"unknown outputs {unknown}; available: {list(OUTPUT_NAMES)}")
    return documents, req_id, wanted


OUTPUT_NAMES = ("decision", "confidence", "trajectory", "source", "low_confidence")

OUTPUT_METADATA = [
    {"name": "decision", "datatype": "BYTES", "shape": [-1]},
    {"name": "confidence", "datatype": "FP32", "shape": [-1]},
    {"name": "trajectory", "datatype": "BYTES", "shape": [-1]},
    {"name": "source", "datatype": "BYTES", "shape": [-1]},
    {"name": "low_confidence", "datatype": "BOOL", "shape": [-1]},
]


def infer_response(model: str, version: str, req_id: str | None, outcomes: list, parameters: dict[str, Any],
                   wanted: list[str] | None) -> dict[str, Any]:
    n = len(outcomes)
    columns = {
        "decision": ("BYTES", [o.decision for o in outcomes]),
        # FP32 has no null: a rules decision (no probability) is 0 here; `source` says it is the rules'.
        "confidence": ("FP32", [0.0 if o.confidence is None else o.confidence for o in outcomes]),
        "trajectory": ("BYTES", [dumps(o.trajectory) for o in outcomes]),
        "source": ("BYTES", [o.source for o in outcomes]),
        "low_confidence": ("BOOL", [o.flagged for o in outcomes]),
    }
    names = wanted or list(OUTPUT_NAMES)
    body: dict[str, Any] = {
        "model_name": model,
        "model_version": version,
        "parameters": parameters,
        "outputs": [{"name": k, "datatype": columns[k][0], "shape": [n], "data": columns[k][1]} for k in names],
    }
    if req_id is not None:
        body["id"] = req_id
    return body
