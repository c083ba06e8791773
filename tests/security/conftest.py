"""Fixtures for the security tests: the chart helpers from tests/helm, an API client per test."""

from __future__ import annotations

import pathlib
import sys

# chartkit (helm + the restricted-v2 checker) lives beside the chart tests; both suites use it.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "helm"))
