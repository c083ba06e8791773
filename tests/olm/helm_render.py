"""The chart as the real helm binary renders it (tests/helm's helpers, importable from tests/olm)."""

from __future__ import annotations

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "arbiter_chartkit", pathlib.Path(__file__).resolve().parents[1] / "helm" / "chartkit.py")
assert _spec and _spec.loader
chartkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chartkit)
render = chartkit.render
