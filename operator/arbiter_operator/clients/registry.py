"""A small typed async client for the Kubeflow Model Registry REST API (`/api/model_registry/v1alpha3`).

Written against the registry's own OpenAPI document (api/openapi/model-registry.yaml of
github.com/kubeflow/model-registry v0.3.0); tests/cluster/registry validates every request and response of this client
against that document while talking to the real server.

Why not the `model-registry` package from PyPI: its `ModelRegistry` class is synchronous (it drives its own
coroutines with `loop.run_until_complete`), calls `nest_asyncio.apply()` unless given a runner (which patches asyncio
for the whole process, kopf's loop included), runs `logging.basicConfig` at import time (re-configuring the
operator's root logger), reads a token from an environment variable by default, does network I/O in its constructor
and brings a second HTTP stack (aiohttp). Each of those is a side effect inside the operator; this client is ~200
lines of httpx with no global state.

Errors are split the way the `Registered` condition needs them:
- `RegistryUnreachable`: connection refused, DNS, TLS, timeouts, 5xx and 503 "datastore unavailable" (retry later);
- `RegistryRejected`: any other 4xx (the request or the credentials are wrong: retrying alone will not help).
Neither carries the token: messages are built from status, path and the server's error body only.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import httpx

API_PREFIX = "/api/model_registry/v1alpha3"

State = Literal["LIVE", "ARCHIVED"]


class RegistryError(Exception):
    """Base class; `str()` never contains a credential."""


class RegistryUnreachable(RegistryError):
    def __init__(self, message: str, status: int | None = None):
        self.status = status  # HTTP status when the registry answered (5xx), None when it did not
        super().__init__(message)


class RegistryRejected(RegistryError):
    def __init__(self, status: int, method: str, path: str, message: str):
        self.status = status
        self.method = method
        self.path = path
        self.server_message = message
        super().__init__(f"registry answered {status} to {method} {path}: {message}")


class RegistrationRefused(RegistryRejected):
    """The registry answered 5xx, but for the data sent, not for an outage: retrying the same request can never
    succeed (e.g. PostgreSQL's SQLSTATE 54000, a property value too large for its index). Permanent."""


# Database errors a 5xx carries when the request's data, not the server, is the problem (PostgreSQL SQLSTATE classes
# 22 "data exception" and 54 "program limit exceeded"; the registry on PostgreSQL reports both as 500).
_PERMANENT_5XX = re.compile(r"SQLSTATE (22\d\d\d|54\d\d\d)|index row (size|requires)|value too long")


def permanent_refusal(status: int, message: str) -> bool:
    return status >= 500 and bool(_PERMANENT_5XX.search(message))


# Typed custom properties: the codec lives with the API vocabulary (the pure layers use it too).
from ..api.registry_values import (  # noqa: E402,F401  (re-exported: the client's wire format)
    bool_value,
    double_value,
    from_custom_properties,
    from_metadata_value,
    int_value,
    string_value,
    to_custom_properties,
)

# ---------------------------------------------------------------- entities


@dataclass(frozen=True)
class Entity:
    """What the registry returned, with the fields Arbiter reads pulled out."""

    id: str
    name: str
    state: str
    custom_properties: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Self:
        return cls(
            id=str(body["id"]),
            name=body.get("name", ""),
            state=body.get("state", ""),
            custom_properties=from_custom_properties(body.get("customProperties")),
            raw=body,
        )


class RegisteredModel(Entity):
    pass


class ModelVersion(Entity):
    @property
    def registered_model_id(self) -> str:
        return str(self.raw.get("registeredModelId", ""))


class ModelArtifact(Entity):
    @property
    def uri(self) -> str:
        return str(self.raw.get("uri") or "")

    @property
    def model_format_name(self) -> str:
        return str(self.raw.get("modelFormatName") or "")


# ---------------------------------------------------------------- client


def tls_verify(ca_bundle_pem: str | None = None, verify: bool = True) -> ssl.SSLContext | bool:
    """TLS verification on by default; a PEM bundle (from a ConfigMap) is added to the system roots."""
    if not verify:
        return False
    ctx = ssl.create_default_context()
    if ca_bundle_pem:
        ctx.load_verify_locations(cadata=ca_bundle_pem)
    return ctx


class RegistryClient:
    """Async client; use as `async with RegistryClient(url, token=...) as rc:`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        ca_bundle_pem: str | None = None,
        verify: bool = True,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # Kept only to scrub it from error bodies: some servers echo the Authorization header back.
        self._redact = token
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + API_PREFIX,
            headers=headers,
            timeout=timeout,
            verify=tls_verify(ca_bundle_pem, verify),
            transport=transport,
            # The registry never redirects; following one could send the token elsewhere.
            follow_redirects=False,
        )

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None,
        not_found_ok: bool = False,
    ) -> Any:
        try:
            resp = await self._http.request(method, path, params=params, json=body)
        except httpx.TransportError as exc:
            # The exception text names host and port only; the Authorization header is never part of it.
            raise RegistryUnreachable(f"cannot reach the registry ({type(exc).__name__}: {exc})") from None
        if resp.status_code == 404 and not_found_ok:
            return None
        if permanent_refusal(resp.status_code, msg := _message(resp, self._redact)):
            raise RegistrationRefused(resp.status_code, method, path, msg)
        if resp.status_code >= 500:
            raise RegistryUnreachable(
                f"registry answered {resp.status_code} to {method} {path}: {_message(resp, self._redact)}",
                resp.status_code,
            )
        if resp.status_code >= 400:
            raise RegistryRejected(resp.status_code, method, path, _message(resp, self._redact))
        return resp.json() if resp.content else None

    async def _find(self, path: str, **params: str | None) -> dict[str, Any] | None:
        query = {k: v for k, v in params.items() if v is not None}
        found: dict[str, Any] | None = await self._call("GET", path, params=query, not_found_ok=True)
        return found

    async def _list(self, path: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query = dict(params or {}, pageSize="100")
        while True:
            page = await self._call("GET", path, params=query)
            items.extend(page.get("items") or [])
            token = page.get("nextPageToken")
            if not token or not page.get("items"):
                return items
            query["nextPageToken"] = token

    # RegisteredModel
    async def find_registered_model(self, *, name: str | None = None,
                                    external_id: str | None = None) -> RegisteredModel | None:
        body = await self._find("/registered_model", name=name, externalId=external_id)
        return RegisteredModel.from_json(body) if body else None

    async def get_registered_model(self, id_: str) -> RegisteredModel:
        return RegisteredModel.from_json(await self._call("GET", f"/registered_models/{id_}"))

    async def create_registered_model(self, body: dict[str, Any]) -> RegisteredModel:
        return RegisteredModel.from_json(await self._call("POST", "/registered_models", body=body))

    async def update_registered_model(self, id_: str, body: dict[str, Any]) -> RegisteredModel:
        return RegisteredModel.from_json(await self._call("PATCH", f"/registered_models/{id_}", body=body))

    # ModelVersion
    async def find_model_version(
        self, *, external_id: str | None = None, name: str | None = None, registered_model_id: str | None = None
    ) -> ModelVersion | None:
        """By externalId, or by name within a RegisteredModel (the two forms the server accepts)."""
        body = await self._find(
            "/model_version", externalId=external_id, name=name, parentResourceId=registered_model_id
        )
        return ModelVersion.from_json(body) if body else None

    async def list_model_versions(self, registered_model_id: str) -> list[ModelVersion]:
        try:
            items = await self._list(f"/registered_models/{registered_model_id}/versions")
        except RegistryUnreachable as exc:
            if exc.status != 500:
                raise
            # Registry v0.3.0 on PostgreSQL answers 500 (`relation "parentcontext" does not exist`) to every query
            # scoped by parent. Listing all versions and filtering here gives the same answer on every server.
            items = [
                i for i in await self._list("/model_versions")
                if str(i.get("registeredModelId")) == str(registered_model_id)
            ]
        return [ModelVersion.from_json(i) for i in items]

    async def create_model_version(self, body: dict[str, Any]) -> ModelVersion:
        return ModelVersion.from_json(await self._call("POST", "/model_versions", body=body))

    async def update_model_version(self, id_: str, body: dict[str, Any]) -> ModelVersion:
        return ModelVersion.from_json(await self._call("PATCH", f"/model_versions/{id_}", body=body))

    # ModelArtifact
    async def find_model_artifact(self, *, external_id: str) -> ModelArtifact | None:
        body = await self._find("/model_artifact", externalId=external_id)
        return ModelArtifact.from_json(body) if body else None

    async def get_model_artifact(self, id_: str) -> ModelArtifact:
        return ModelArtifact.from_json(await self._call("GET", f"/model_artifacts/{id_}"))

    async def create_model_version_artifact(self, model_version_id: str, body: dict[str, Any]) -> ModelArtifact:
        """Create a ModelArtifact and attach it to the version (the server's upsert endpoint)."""
        body = dict(body, artifactType="model-artifact")
        return ModelArtifact.from_json(
            await self._call("POST", f"/model_versions/{model_version_id}/artifacts", body=body)
        )

    async def update_model_artifact(self, id_: str, body: dict[str, Any]) -> ModelArtifact:
        body = dict(body, artifactType="model-artifact")
        return ModelArtifact.from_json(await self._call("PATCH", f"/model_artifacts/{id_}", body=body))


def _message(resp: httpx.Response, redact: str | None = None) -> str:
    text = None
    try:
        body = resp.json()
        if isinstance(body, dict) and body.get("message"):
            text = str(body["message"])
    except ValueError:
        pass
    if text is None:
        text = resp.text or resp.reason_phrase or ""
    if redact:
        # The message goes to status and events: never the token, even when the server echoes it.
        text = text.replace(redact, "[redacted]")
    return text[:500].strip()
