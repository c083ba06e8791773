"""KServe V2 (Open Inference Protocol) REST bodies: parsing the infer request, building the response. Pure.

The input is one BYTES tensor whose elements are JSON documents written as UTF-8 strings (the JSON form of
BYTES; base64 is not part of it). Shape [N] or [N, 1]; `data` flat or nested one level per the spec. The binary
tensor data extension (tensor_binary.py) is undone before parsing and redone after `infer_response`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .jsonutil import dumps, reject_constant

if TYPE_CHECKING:
    from .decide import Outcome

MAX_ROWS = 256


class BadRequest(ValueError):
    """400 with this message."""


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def loads_strict(text: str | bytes) -> Any:
    """Inputs are parsed by the standard library: exact integers (no 64-bit limit), no NaN/Infinity."""
    return json.loads(text, parse_constant=reject_constant, parse_float=_finite)


@dataclass(frozen=True)
class Outputs:
    """The outputs an infer request asks for, in answer order, and those it wants as binary tensor data."""

    names: tuple[str, ...]
    binary: frozenset[str] = frozenset()


def _flag(params: Any, key: str, where: str) -> bool | None:
    if params is None:
        return None
    if not isinstance(params, dict):
        raise BadRequest(f"{where} must be an object")
    value = params.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{where}.{key} must be true or false, got {value!r}")
    return value


def parse_outputs(body: dict[str, Any]) -> Outputs:
    """`outputs` (names, each with an optional `parameters.binary_data`) and `parameters.binary_data_output`."""
    all_binary = bool(_flag(body.get("parameters"), "binary_data_output", "'parameters'"))
    outputs = body.get("outputs")
    if outputs is None:
        return Outputs(OUTPUT_NAMES, frozenset(OUTPUT_NAMES) if all_binary else frozenset())
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                for o in outputs):
        raise BadRequest("'outputs' must be a list of {name}")
    names = tuple(o["name"] for o in outputs)
    unknown = sorted(set(names) - set(OUTPUT_NAMES))
    if unknown:
        raise BadRequest(f"unknown outputs {unknown}; available: {list(OUTPUT_NAMES)}")
    binary = set()
    for i, o in enumerate(outputs):
        own = _flag(o.get("parameters"), "binary_data", f"outputs[{i}].parameters")
        if own or (own is None and all_binary):  # an output's own binary_data wins over the request's
            binary.add(o["name"])
    return Outputs(names or OUTPUT_NAMES, frozenset(binary))


def parse_infer(body: Any) -> tuple[list[Any], str | None, Outputs]:
    """Return (documents, request id, requested outputs) or raise BadRequest naming what is wrong."""
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
    return documents, req_id, parse_outputs(body)


OUTPUT_NAMES = ("decision", "confidence", "trajectory", "source", "low_confidence")

OUTPUT_METADATA = [
    {"name": "decision", "datatype": "BYTES", "shape": [-1]},
    {"name": "confidence", "datatype": "FP32", "shape": [-1]},
    {"name": "trajectory", "datatype": "BYTES", "shape": [-1]},
    {"name": "source", "datatype": "BYTES", "shape": [-1]},
    {"name": "low_confidence", "datatype": "BOOL", "shape": [-1]},
]


def infer_response(model: str, version: str, req_id: str | None, outcomes: list[Outcome], parameters: dict[str, Any],
                   wanted: Outputs | None = None) -> dict[str, Any]:
    n = len(outcomes)
    columns = {
        "decision": ("BYTES", [o.decision for o in outcomes]),
        # FP32 has no null: a rules decision (no probability) is 0 here; `source` says it is the rules'.
        "confidence": ("FP32", [0.0 if o.confidence is None else o.confidence for o in outcomes]),
        "trajectory": ("BYTES", [dumps(o.trajectory) for o in outcomes]),
        "source": ("BYTES", [o.source for o in outcomes]),
        "low_confidence": ("BOOL", [o.flagged for o in outcomes]),
    }
    names = wanted.names if wanted else OUTPUT_NAMES
    body: dict[str, Any] = {
        "model_name": model,
        "model_version": version,
        "parameters": parameters,
        "outputs": [{"name": k, "datatype": columns[k][0], "shape": [n], "data": columns[k][1]} for k in names],
    }
    if req_id is not None:
        body["id"] = req_id
    return body


def wants_json_readiness(accept: str | None) -> bool:
    """True when the caller names application/json in Accept (not through */*): it reads `{"ready": false}` from a
    200 (KServe's SDK raises on any other status). Probes (the kubelet sends */*) and tritonclient get the 503."""
    for item in (accept or "").split(","):
        media, _, params = item.partition(";")
        if media.strip().lower() == "application/json":
            q = next((p.split("=", 1)[1].strip() for p in params.split(";") if p.strip().lower().startswith("q=")),
                     "1")
            return q not in ("0", "0.0", "0.00", "0.000")
    return False
