"""Fixtures for the registry and artifact tests: the real Model Registry (on PostgreSQL) and a contract-checked
client."""

from __future__ import annotations

import pytest
from arbiter_devenv.registryserver import start_model_registry
from arbiter_operator.clients.registry import RegistryClient
from support.openapi_contract import OpenApiDoc, ValidatingTransport


@pytest.fixture(scope="session")
def model_registry():
    """The Kubeflow Model Registry server (built from hack/tools/model-registry) on a fresh PostgreSQL.

    `.url` is the base URL; `.api_url` adds /api/model_registry/v1alpha3; `.pause()`/`.resume()` stop and restart the
    server on the same port and database (an outage).
    """
    with start_model_registry() as mr:
        yield mr


@pytest.fixture(scope="session")
def openapi_doc() -> OpenApiDoc:
    return OpenApiDoc()


@pytest.fixture
async def registry_client(model_registry, openapi_doc):
    """Arbiter's client, every exchange validated against the registry's OpenAPI document."""
    transport = ValidatingTransport(openapi_doc)
    async with RegistryClient(model_registry.url, transport=transport) as client:
        client.transport = transport  # tests count exchanges to prove nothing was rewritten
        yield client
