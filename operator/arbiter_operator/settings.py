"""Operator-wide settings chosen by the platform team at install time (Helm values -> flags/environment)."""

from __future__ import annotations

import os

from .api.models import DEFAULT_RUNTIME_IMAGE

RUNTIME_IMAGE_ENV = "ARBITER_RUNTIME_IMAGE"


def runtime_image() -> str:
    """The runtime image newly deployed versions run, unless a DecisionModel sets spec.serving.runtimeImage."""
    return os.environ.get(RUNTIME_IMAGE_ENV, "").strip() or DEFAULT_RUNTIME_IMAGE
