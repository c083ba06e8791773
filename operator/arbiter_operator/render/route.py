"""The Route, named after the DecisionModel.

Never after an InferenceService: OpenShift AI's controller deletes Routes that bear an InferenceService's name.
Traffic moves between versions by weights (`to` + `alternateBackends`), which is what promotion steps change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.models import DecisionModel
from .common import SERVING_PORT, metadata, predictor_service

TIMEOUT_ANNOTATION = "haproxy.router.openshift.io/timeout"
# OpenShift AI's KServe puts kube-rbac-proxy in front of the predictor (container and Service port named `https`,
# serving certificate from the service CA); the router trusts the service CA for reencrypt without a
# destinationCACertificate. The port name is the same on every version's predictor Service, so it also holds for
# alternateBackends. Edge goes to the runtime's own port by number: KServe names the plain port after each Service.
PROXY_PORT_NAME = "https"


def route_tls(dm: DecisionModel) -> str:
    """The effective termination: spec.exposure.tls, or reencrypt with auth on and edge with it off."""
    exposure = dm.spec.exposure
    return exposure.tls or ("reencrypt" if exposure.auth else "edge")


def render_route(dm: DecisionModel, traffic: Mapping[str, int]) -> dict[str, Any] | None:
    """traffic: version -> percent (sums to 100). None when no version can take traffic yet."""
    backends = [(v, w) for v, w in traffic.items() if w > 0]
    if not backends:
        return None
    # The heaviest backend goes in `to` (ties: by name) so the Route reads naturally and stays stable across renders.
    backends.sort(key=lambda vw: (-vw[1], vw[0]))
    exposure = dm.spec.exposure
    first, *rest = backends
    spec: dict[str, Any] = {
        "to": {
            "kind": "Service",
            "name": predictor_service(dm.metadata.name, first[0]),
            "weight": first[1],
        },
        "port": {"targetPort": PROXY_PORT_NAME if route_tls(dm) == "reencrypt" else SERVING_PORT},
        "tls": {"termination": route_tls(dm), "insecureEdgeTerminationPolicy": "Redirect"},
        "wildcardPolicy": "None",
    }
    if exposure.host:
        spec["host"] = exposure.host
    if rest:
        spec["alternateBackends"] = [
            {"kind": "Service", "name": predictor_service(dm.metadata.name, v), "weight": w}
            for v, w in rest
        ]
    return {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": metadata(
            dm, dm.metadata.name, "route", annotations={TIMEOUT_ANNOTATION: exposure.timeout}
        ),
        "spec": spec,
    }
