"""JSON for the operator's hot paths (watch lines, apiserver answers, the watch cache, apply bodies): orjson, which
decodes and encodes in C several times faster than the standard library; decoding every watch event was the largest
single share of the operator's CPU at fleet scale.

`loads` raises `ValueError` (orjson's JSONDecodeError is json.JSONDecodeError) for anything that is not JSON,
including what the standard library would accept but no apiserver sends: NaN, numbers out of a double's range, lone
surrogates, nesting deeper than 1,024. Integers beyond 64 bits decode as floats. `dumps` falls back to the standard
library for what orjson refuses (integers beyond 64 bits, non-string keys), so a rendered object always encodes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

loads = orjson.loads


def dumps(obj: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON bytes of `obj`."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError:
        return json.dumps(obj, sort_keys=sort_keys, separators=(",", ":")).encode()
