"""The Open Inference Protocol's binary tensor data extension (REST), in and out, as KServe and Triton speak it.

A body is a JSON header of `Inference-Header-Content-Length` bytes followed by the tensors' raw data, in the order of
the tensors in the header; each tensor that has raw data says how many bytes are its in `parameters.binary_data_size`
(and has no `data`). A BYTES tensor's raw data is its elements one after the other, each a 4-byte little-endian length
and that many bytes; FP32 is 4-byte little-endian IEEE floats; BOOL one byte per element. KServe's SDK
(`InferInput.set_data_from_numpy`) and tritonclient send inputs this way by default.

Outputs are answered in binary when the request asks: `parameters.binary_data_output: true` for every output, or
`parameters.binary_data` on one requested output (which wins); the answer then carries the same header.

Every size is checked against the bytes that are there before anything is sliced: a hostile body gets a 400 naming
the tensor and the number that does not fit.
"""

from __future__ import annotations

import struct
from typing import Any

from .bodies import json_text
from .jsonutil import dumps_bytes
from .protocol import MAX_ROWS, BadRequest

HEADER_LENGTH = "inference-header-content-length"
SIZE = "binary_data_size"


def split_body(body: bytes, framing: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary data) of a body; `framing` is the Inference-Header-Content-Length value, if any."""
    if framing is None:
        return body, b""
    text = framing.strip()
    if not text.isascii() or not text.isdigit():
        raise BadRequest(f"Inference-Header-Content-Length must be a non-negative integer, got {framing[:40]!r}")
    length = int(text)
    if length == 0:
        raise BadRequest("Inference-Header-Content-Length is 0: the body has no JSON header")
    if length > len(body):
        raise BadRequest(f"Inference-Header-Content-Length says the JSON header is {length} bytes, but the body "
                         f"has only {len(body)}")
    return body[:length], body[length:]


def _size(tensor: dict[str, Any], i: int) -> int | None:
    params = tensor.get("parameters")
    if not isinstance(params, dict) or SIZE not in params:
        return None
    size = params[SIZE]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"inputs[{i}].parameters.binary_data_size must be a non-negative integer, got {size!r}")
    if "data" in tensor:
        raise BadRequest(f"inputs[{i}] has both 'data' and parameters.binary_data_size; send one")
    return size


def attach_inputs(document: Any, binary: bytes) -> Any:
    """`document` with each binary input's raw data decoded into `data` (BYTES elements as UTF-8 strings), or
    BadRequest naming the size or element that does not fit. A document without binary inputs is returned as is."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list):
        return document  # parse_infer names what is wrong with it
    offset, attached = 0, []
    for i, tensor in enumerate(inputs):
        size = _size(tensor, i) if isinstance(tensor, dict) else None
        if size is None:
            attached.append(tensor)
            continue
        if size > len(binary) - offset:
            raise BadRequest(f"inputs[{i}].parameters.binary_data_size is {size} bytes, past the end of the body: "
                             f"{len(binary) - offset} bytes of binary data remain")
        if tensor.get("datatype") != "BYTES":
            raise BadRequest(f"inputs[{i}].datatype must be BYTES (JSON documents as UTF-8 strings), got "
                             f"{tensor.get('datatype')!r}")
        attached.append({**tensor, "data": bytes_elements(binary[offset:offset + size], f"inputs[{i}]")})
        offset += size
    if offset != len(binary):
        raise BadRequest(f"the body has {len(binary)} bytes of binary data after the JSON header, but the inputs' "
                         f"binary_data_size add up to {offset}")
    return {**document, "inputs": attached}


def bytes_elements(raw: bytes, where: str) -> list[str]:
    """A BYTES tensor's elements (4-byte little-endian length, then the bytes), each UTF-8 text."""
    out: list[str] = []
    offset = 0
    while offset < len(raw):
        if len(out) == MAX_ROWS:
            raise BadRequest(f"{where} has more than {MAX_ROWS} elements; at most {MAX_ROWS} rows per request")
        left = len(raw) - offset
        if left < 4:
            raise BadRequest(f"{where} element {len(out)}: the 4-byte length is cut off ({left} bytes remain)")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if length > left - 4:
            raise BadRequest(f"{where} element {len(out)} says {length} bytes, but the tensor has only {left - 4} "
                             "left")
        out.append(json_text(raw[offset:offset + length], f"{where} element {len(out)}"))
        offset += length
    return out


def _raw(datatype: str, data: list[Any]) -> bytes:
    if datatype == "BYTES":
        encoded = [v.encode() for v in data]
        return b"".join(struct.pack("<I", len(b)) + b for b in encoded)
    if datatype == "FP32":
        return struct.pack(f"<{len(data)}f", *data)
    if datatype == "BOOL":
        return bytes(1 if v else 0 for v in data)
    raise ValueError(f"no binary form for {datatype}")  # a defect: every output's datatype is above


def encode_outputs(body: dict[str, Any], binary: frozenset[str]) -> tuple[bytes, int]:
    """The response body with the outputs named in `binary` moved after the JSON header; (body, header length)."""
    raws = []
    for out in body["outputs"]:
        if out["name"] in binary:
            raw = _raw(out["datatype"], out.pop("data"))
            out["parameters"] = {SIZE: len(raw)}
            raws.append(raw)
    head = dumps_bytes(body)
    return head + b"".join(raws), len(head)
