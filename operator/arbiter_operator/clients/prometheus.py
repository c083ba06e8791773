"""Prometheus HTTP API client (instant queries), for canary analysis.

Default shape: OpenShift user-workload monitoring through Thanos Querier's tenancy port (9092), with the operator's
own projected ServiceAccount token and TLS verified against the service CA. The tenancy port answers for one
namespace per request, named by a `namespace` URL parameter: its kube-rbac-proxy asks the apiserver whether the token
may `get pods.metrics.k8s.io` there (the verb follows the HTTP method, so a query is a GET: a POST would ask for
`create`), and its prom-label-proxy confines the PromQL to that namespace. So the operator needs no cluster-wide read
of every tenant's metrics (`cluster-monitoring-view`), only what its RBAC grants in the namespaces it serves.
The web port (9091, `tenancy: false`) and plain Prometheus take a POST with the query in the body (long PromQL stays
out of URLs and proxies' access logs). Only `/api/v1/query` is used. Errors name the endpoint and the HTTP status,
never the token.
"""

from __future__ import annotations

import base64
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

DEFAULT_URL = "https://thanos-querier.openshift-monitoring.svc:9092"
TENANCY_PORT = 9092  # Thanos Querier's port that answers for one namespace per request
# Where OpenShift mounts the service CA bundle into pods that ask for it (service.beta.openshift.io/inject-cabundle).
SERVICE_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
# The pod's own ServiceAccount token (projected and rotated by the kubelet): the tenancy port's default credential.
SERVICE_ACCOUNT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# Keys read from the configuration Secret (see docs/operations.md, "Prometheus connection").
SECRET_URL_KEY = "url"
SECRET_TOKEN_KEY = "token"
SECRET_CA_KEY = "ca.crt"


class PrometheusError(Exception):
    """A query could not be answered. The message is safe to put in status and events."""


@dataclass(frozen=True)
class PrometheusConfig:
    url: str = DEFAULT_URL
    token: str | None = field(default=None, repr=False)  # never printed
    verify: bool = True
    ca_pem: str | None = field(default=None, repr=False)  # CA bundle (PEM text) to verify the server with
    ca_file: str | None = None  # or a path to one
    token_file: str | None = None  # re-read on every query: projected ServiceAccount tokens rotate
    timeout_seconds: float = 10.0
    tenancy: bool = False  # Thanos Querier's tenancy port: GET, with the namespace of each query as a URL parameter

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PrometheusConfig:
        """Operator configuration (the Helm chart sets these; the token and CA come from a projected volume or a
        mounted Secret/ConfigMap): ARBITER_PROMETHEUS_URL, ARBITER_PROMETHEUS_TENANCY ("true"/"false"; unset: true
        when the URL's port is 9092), ARBITER_PROMETHEUS_TOKEN_FILE (unset on the tenancy port: the pod's own
        ServiceAccount token), ARBITER_PROMETHEUS_CA_FILE, ARBITER_PROMETHEUS_INSECURE_SKIP_VERIFY ("true" to skip TLS
        verification; for tests only)."""
        url = env.get("ARBITER_PROMETHEUS_URL") or DEFAULT_URL
        ca_file = env.get("ARBITER_PROMETHEUS_CA_FILE") or (
            SERVICE_CA_FILE if os.path.exists(SERVICE_CA_FILE) else None
        )
        tenancy = _flag(env.get("ARBITER_PROMETHEUS_TENANCY"), default=_port(url) == TENANCY_PORT)
        token_file = env.get("ARBITER_PROMETHEUS_TOKEN_FILE") or (
            SERVICE_ACCOUNT_TOKEN_FILE if tenancy and os.path.exists(SERVICE_ACCOUNT_TOKEN_FILE) else None
        )
        return cls(
            url=url,
            token_file=token_file,
            ca_file=ca_file,
            verify=not _flag(env.get("ARBITER_PROMETHEUS_INSECURE_SKIP_VERIFY"), default=False),
            tenancy=tenancy,
        )

    def bearer(self) -> str | None:
        if self.token_file:
            try:
                with open(self.token_file) as fh:
                    return fh.read().strip() or None
            except OSError as exc:
                raise PrometheusError(
                    f"cannot read the Prometheus token file {self.token_file}: {exc.strerror}") from exc
        return self.token

    @classmethod
    def from_secret_data(
        cls, data: Mapping[str, str], *, base64_encoded: bool = True, **overrides: Any
    ) -> PrometheusConfig:
        """Build from a Secret's `data` (base64 values, as the API returns them) or `stringData` (plain)."""

        def get(key: str) -> str | None:
            raw = data.get(key)
            if raw is None:
                return None
            return base64.b64decode(raw).decode() if base64_encoded else raw

        kwargs: dict[str, Any] = {"tenancy": _port(DEFAULT_URL) == TENANCY_PORT}
        if url := get(SECRET_URL_KEY):
            kwargs["url"] = url.strip()
            kwargs["tenancy"] = _port(kwargs["url"]) == TENANCY_PORT
        if token := get(SECRET_TOKEN_KEY):
            kwargs["token"] = token.strip()
        if ca := get(SECRET_CA_KEY):
            kwargs["ca_pem"] = ca
        kwargs.update(overrides)
        return cls(**kwargs)

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.verify:
            return False
        if self.ca_pem is None and self.ca_file is None:
            return True  # system trust store
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_pem)
        return ctx


Sample = tuple[dict[str, str], float]


class PrometheusClient:
    """`query(promql, at)` -> [(labels, value)] for vector and scalar results."""

    def __init__(self, config: PrometheusConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        headers = {"Accept": "application/json"}
        self._http = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            headers=headers,
            verify=config.ssl_context(),
            timeout=config.timeout_seconds,
            transport=transport,
        )

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def query(self, promql: str, at: datetime | None = None, namespace: str | None = None) -> list[Sample]:
        """namespace: the namespace whose series the query reads; the tenancy port needs it (it answers for that
        namespace alone), the others ignore it."""
        params = {"query": promql}
        if at is not None:
            if at.tzinfo is None:
                at = at.replace(tzinfo=UTC)
            params["time"] = f"{at.timestamp():.3f}"
        where = f"{self.config.url.rstrip('/')}/api/v1/query"
        if self.config.tenancy and not namespace:
            raise PrometheusError(f"{where}: the tenancy port answers for one namespace, and the query names none")
        token = self.config.bearer()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            if self.config.tenancy:
                # kube-rbac-proxy reads the namespace from the URL and checks the verb the method implies (GET: get).
                resp = await self._http.get("/api/v1/query", params={**params, "namespace": namespace or ""},
                                            headers=headers)
            else:
                # POST with a form body keeps long PromQL out of URLs (and out of proxies' access logs).
                resp = await self._http.post("/api/v1/query", data=params, headers=headers)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{where}: {type(exc).__name__}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code in (401, 403):
            raise PrometheusError(f"{where}: HTTP {resp.status_code}: {self._refusal(namespace)}")
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error", "") if isinstance(body, dict) else resp.text[:200]
            raise PrometheusError(f"{where}: HTTP {resp.status_code}: {detail}")
        return _samples(body.get("data", {}))


    def _refusal(self, namespace: str | None) -> str:
        if self.config.tenancy:
            return (f"the token is missing or may not read namespace {namespace}'s metrics (on the tenancy port it "
                    "needs `get` on pods.metrics.k8s.io there: the chart grants it to the operator's ServiceAccount)")
        return "the token is missing or may not read metrics (on OpenShift it needs the cluster-monitoring-view role)"


def _flag(value: str | None, *, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("true", "1", "yes")


def _port(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:  # a port that is not a number: the client's first query names the URL
        return None


def _samples(data: dict[str, Any]) -> list[Sample]:
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        return [({}, _num(result[1]))]
    if kind == "vector" and isinstance(result, list):
        return [(dict(item.get("metric", {})), _num(item["value"][1])) for item in result]
    raise PrometheusError(f"unexpected result type {kind!r}; analysis queries must return a vector or a scalar")


def _num(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan
