"""Istio sidecar settings for the predictor pods (spec.mesh.sidecar).

OpenShift AI's KServe runs without a mesh, but a namespace may still be mesh-injected (Service Mesh member, older
Serverless installs). The sidecar then intercepts the serving port and breaks the router's direct path and the
runtime's auth, so Arbiter excludes it (or the whole sidecar) from the predictor pods.
"""

from __future__ import annotations

from collections.abc import Mapping

from .common import SERVING_PORT

INJECTION_LABEL = "istio-injection"  # istio-injection=enabled
REVISION_LABEL = "istio.io/rev"  # revision-based injection (Service Mesh 2/3)
EXCLUDE_INBOUND = "traffic.sidecar.istio.io/excludeInboundPorts"
INJECT = "sidecar.istio.io/inject"


def namespace_injected(namespace_labels: Mapping[str, str]) -> bool:
    if namespace_labels.get(INJECTION_LABEL) == "enabled":
        return True
    if namespace_labels.get(INJECTION_LABEL) == "disabled":
        return False
    return bool(namespace_labels.get(REVISION_LABEL))


def sidecar_settings(mode: str, namespace_labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(pod annotations, pod labels) for the predictor, per spec.mesh.sidecar."""
    if mode == "none":
        return {}, {}
    if mode == "disable":
        # The label is what current Istio reads; the annotation covers older injectors.
        return {INJECT: "false"}, {INJECT: "false"}
    if mode == "exclude-inbound" or (mode == "auto" and namespace_injected(namespace_labels)):
        return {EXCLUDE_INBOUND: str(SERVING_PORT)}, {}
    return {}, {}
