"""The chart as the real helm binary renders it (chartkit's `render`, under the name the OLM tests use)."""

from __future__ import annotations

from support.chartkit import render

__all__ = ["render"]
