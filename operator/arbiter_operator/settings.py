"""Operator-wide settings chosen by the platform team at install time (Helm values -> flags/environment)."""

from __future__ import annotations

import os

from .api.models import DEFAULT_METRICS_READER_SECRET, DEFAULT_RUNTIME_IMAGE

RUNTIME_IMAGE_ENV = "ARBITER_RUNTIME_IMAGE"
METRICS_READER_SECRET_ENV = "ARBITER_METRICS_READER_SECRET"
S3_OWN_CREDENTIALS_ENV = "ARBITER_S3_OWN_CREDENTIALS"
ARGOCD_NAMESPACE_ENV = "ARBITER_ARGOCD_NAMESPACE"


def runtime_image() -> str:
    """The runtime image newly deployed versions run, unless a DecisionModel sets spec.serving.runtimeImage."""
    return os.environ.get(RUNTIME_IMAGE_ENV, "").strip() or DEFAULT_RUNTIME_IMAGE


def metrics_reader_secret() -> str:
    """The Secret, in each DecisionModel's namespace, whose `token` Prometheus presents to the runtime's metrics when
    the model's spec.exposure.auth is on (the PodMonitor's authorization)."""
    return os.environ.get(METRICS_READER_SECRET_ENV, "").strip() or DEFAULT_METRICS_READER_SECRET


def s3_own_credentials() -> bool:
    """Whether the artifact checks read a storage-config entry without keys with the operator's own AWS credentials
    (botocore's chain: a web identity, instance metadata, ...). Off by default: with it, a DecisionModel in any
    watched namespace can have the operator read what the operator's role may read (docs/security.md)."""
    return os.environ.get(S3_OWN_CREDENTIALS_ENV, "").strip().lower() in ("true", "1", "yes", "on")


def argocd_namespace() -> str | None:
    """Where Argo CD keeps its Applications (argocd, openshift-gitops): the promotion history names the Git revision
    of a DecisionModel it tracks by reading the Application there. None: not read (an Application whose tracking
    annotation names its own namespace is read all the same)."""
    return os.environ.get(ARGOCD_NAMESPACE_ENV, "").strip() or None
