"""Where the Model Registry of a DecisionModel is, and how to reach it: `spec.registry` resolved against the cluster
(ModelRegistry resource, token Secret, CA ConfigMap, the service account's files). Reads only."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..api.conditions import Condition
from ..api.models import DecisionModel
from ..api.names import CORE_API, MODEL_REGISTRY_API
from ..clients.registry import RegistryClient
from ..kube.client import KubeError
from ..render.registry import registered_condition


def registry_url_from_model_registry(obj: dict[str, Any]) -> str:
    """REST base URL of a `ModelRegistry` (modelregistry.opendatahub.io) from its spec and status.

    The operator's status lists the hosts it serves on; in-cluster, the Service host (`*.svc...`) is used. With
    kube-rbac-proxy or the OAuth proxy in front (OpenShift AI's default) the endpoint is HTTPS on the proxy port;
    without, plain HTTP on the REST port. Raises ValueError with what is missing.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ref = f"ModelRegistry {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    hosts: list[str] = list(status.get("hosts") or [])
    if not hosts and status.get("hostsStr"):
        hosts = [h.strip() for h in str(status["hostsStr"]).split(",") if h.strip()]
    if not hosts:
        raise ValueError(
            f"{ref} has no status.hosts yet; wait until the registry is Available or set spec.registry.url"
        )
    svc = [h for h in hosts if ".svc" in h]
    host = (svc or hosts)[0]
    proxy = spec.get("kubeRBACProxy") or spec.get("oauthProxy")
    if proxy is not None:
        return f"https://{host}:{int(proxy.get('port') or 8443)}"
    rest = spec.get("rest") or {}
    return f"http://{host}:{int(rest.get('port') or 8080)}"


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class RegistryTarget:
    """Where and how to reach the registry; `error` (a `Registered` condition) when it cannot be worked out."""

    url: str | None = None
    token: str | None = field(default=None, repr=False)
    ca_bundle_pem: str | None = field(default=None, repr=False)
    registry_name: str | None = None  # the ModelRegistry's name, for the InferenceService label
    error: Condition | None = None

    def client(self, timeout: float = 10.0) -> RegistryClient:
        return RegistryClient(self.url or "", token=self.token, ca_bundle_pem=self.ca_bundle_pem, timeout=timeout)


def _read_file(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


async def _referenced(kube: Any, kind: str, ns: str, ref: Any, default_key: str, field: str) -> tuple[str | None, str]:
    """The value under `ref.key` (or `default_key`) of the Secret or ConfigMap `ref` names (None when either is
    missing), and the message that says so."""
    obj = await kube.aget(CORE_API, kind, ns, ref.name)
    key = ref.key or default_key
    what = "token" if kind == "Secret" else "CA"
    return ((obj or {}).get("data") or {}).get(key), (
        f"{kind} {ref.name} (key {key}) with the registry {what} not found in namespace {ns}; create it or fix "
        f"spec.registry.{field}")


async def resolve_registry(
    kube: Any, dm: DecisionModel, now: datetime, sa_dir: str = SA_DIR
) -> RegistryTarget | None:
    """Turn `spec.registry` into URL, token and CA, reading the cluster through `kube` (kube.client.KubeClient,
    awaited). None when the DecisionModel names no registry (then there is no `Registered`
    condition at all)."""
    reg = dm.spec.registry
    if reg is None:
        return None
    ns = dm.metadata.namespace
    gen = dm.metadata.generation
    target = RegistryTarget()
    try:
        if reg.modelRegistryRef is not None:
            ref_ns = reg.modelRegistryRef.namespace or ns
            obj = await kube.aget(MODEL_REGISTRY_API, "ModelRegistry", ref_ns, reg.modelRegistryRef.name)
            if obj is None:
                target.error = registered_condition(
                    gen, now, unreachable=f"ModelRegistry {ref_ns}/{reg.modelRegistryRef.name} not found")
                return target
            try:
                target.url = registry_url_from_model_registry(obj)
            except ValueError as exc:
                target.error = registered_condition(gen, now, unreachable=str(exc))
                return target
            target.registry_name = reg.modelRegistryRef.name
        else:
            target.url = reg.url
        if reg.tokenSecretRef is not None:
            raw, missing = await _referenced(kube, "Secret", ns, reg.tokenSecretRef, "token", "tokenSecretRef")
            if raw is None:
                target.error = registered_condition(gen, now, rejected=missing)
                return target
            target.token = base64.b64decode(raw).decode().strip()
        else:
            target.token = _read_file(os.path.join(sa_dir, "token"))  # the operator's own identity
        pems = []
        if reg.caBundleConfigMapRef is not None:
            pem, missing = await _referenced(kube, "ConfigMap", ns, reg.caBundleConfigMapRef, "ca.crt",
                                             "caBundleConfigMapRef")
            if pem is None:
                target.error = registered_condition(gen, now, rejected=missing)
                return target
            pems.append(pem)
        # OpenShift's service CA signs the in-cluster registry endpoints (kube-rbac-proxy); trust it when mounted.
        service_ca = _read_file(os.path.join(sa_dir, "service-ca.crt"))
        if service_ca:
            pems.append(service_ca)
        target.ca_bundle_pem = "\n".join(pems) or None
    except KubeError as exc:  # e.g. 403 reading the Secret: the apiserver's message names no secret value
        target.error = registered_condition(gen, now, unreachable=f"cannot read spec.registry references ({exc})")
    return target
