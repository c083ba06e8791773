"""Exposed means reachable (pure): the Route the operator renders reaches a backend only where the Service it points
to has the Route's target port. OpenShift AI's KServe removes the runtime's plain port 8080 from the predictor
Service when auth is on (only its authenticating proxy's `https` port stays), so a Route to 8080 there reaches
nothing. The runtime's port is judged; the proxy's named port `https` is OpenShift AI's to provide and is not (on
KServe without that proxy, expose with `auth: false`). A Service not seen yet (still being made, or not readable) is
not judged either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.models import DecisionModel
from .predictors import as_map, as_maps

TARGET_PORT_MISSING = "RouteTargetPortMissing"
ROUTE_NOT_OWNED = "RouteNotOwned"


def _has_port(service: Mapping[str, Any], target: Any) -> bool:
    """A Route's targetPort names a Service port by name, or the pods' port by number (the Service's targetPort)."""
    for port in as_maps(as_map(service.get("spec")).get("ports")):
        if isinstance(target, str) and target in (port.get("name"), port.get("targetPort")):
            return True
        if isinstance(target, int) and (port.get("targetPort") == target
                                        or ("targetPort" not in port and port.get("port") == target)):
            return True
    return False


def _ports(service: Mapping[str, Any]) -> str:
    ports = [f"{p.get('name') or '-'}:{p.get('port')}" for p in as_maps(as_map(service.get("spec")).get("ports"))]
    return ", ".join(ports) or "none"


def route_backend_problem(
    dm: DecisionModel, route: Mapping[str, Any], services: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Why the Route cannot reach a backend it names (None: every Service seen has its target port)."""
    spec = as_map(route.get("spec"))
    target = as_map(spec.get("port")).get("targetPort")
    for backend in [as_map(spec.get("to")), *as_maps(spec.get("alternateBackends"))]:
        name = backend.get("name")
        service = services.get(str(name))
        if service is None or not isinstance(target, int) or _has_port(service, target):
            continue
        hint = ("with auth on, OpenShift AI's KServe keeps only its proxy's port https: leave spec.exposure.tls unset"
                if dm.spec.exposure.auth else "check KServe's predictor Service")
        return (f"Route {dm.metadata.name} sends traffic to port {target!r} of Service {name}, which has no such port "
                f"(its ports: {_ports(service)}): {hint}")
    return None
