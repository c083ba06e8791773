"""The contract checker itself: it must reject what the registry's OpenAPI document does not allow, or the
contract-validated registry tests would prove nothing."""

from __future__ import annotations

import json

import pytest
from arbiter_operator.clients.registry import to_custom_properties
from support.openapi_contract import ContractViolation, OpenApiDoc

P = "/api/model_registry/v1alpha3"


@pytest.fixture(scope="module")
def doc():
    return OpenApiDoc()


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def test_valid_requests_pass(doc):
    doc.check_request("POST", P + "/registered_models", "",
                      body({"name": "m", "customProperties": to_custom_properties({"a": "x", "n": 1, "f": 0.5})}))
    doc.check_request("PATCH", P + "/model_versions/12", "", body({"state": "ARCHIVED"}))
    doc.check_request("GET", P + "/model_version", "externalId=arbiter%3Am%3A1", b"")
    doc.check_request("POST", P + "/model_versions/3/artifacts", "",
                      body({"artifactType": "model-artifact", "name": "1", "uri": "s3://b/p"}))


@pytest.mark.parametrize(
    "method,path,query,payload,needle",
    [
        ("POST", "/registered_models", "", {"name": 5}, "name"),
        ("POST", "/registered_models", "",
         {"name": "m", "customProperties": {"k": {"metadataType": "MetadataStringValue"}}}, "string_value"),
        ("POST", "/registered_models", "",
         {"name": "m", "customProperties": {"k": {"metadataType": "Bogus"}}}, "metadataType"),
        ("PATCH", "/model_versions/1", "", {"state": "GONE"}, "state"),
        ("POST", "/model_versions", "", {"name": "1.0.0"}, "registeredModelId"),
        ("POST", "/model_versions/3/artifacts", "", {"artifactType": "spaceship"}, "artifactType"),
        ("GET", "/model_version", "versionName=1", None, "not declared"),
        ("GET", "/no_such_thing", "", None, "no such path"),
        ("DELETE", "/registered_models/1", "", None, "no DELETE"),
    ],
)
def test_violations_are_caught(doc, method, path, query, payload, needle):
    with pytest.raises(ContractViolation, match=needle):
        doc.check_request(method, P + path, query, body(payload) if payload is not None else b"")


def test_responses_are_checked(doc):
    template = P + "/registered_models/{registeredmodelId}"
    doc.check_response("GET", template, 200, body({"id": "1", "name": "m", "state": "LIVE"}))
    with pytest.raises(ContractViolation, match="state"):
        doc.check_response("GET", template, 200, body({"id": "1", "name": "m", "state": "SLEEPING"}))
    with pytest.raises(ContractViolation, match="not documented"):
        doc.check_response("GET", template, 418, body({"code": "x", "message": "y"}))
    with pytest.raises(ContractViolation, match="message"):
        doc.check_response("GET", template, 404, body({"code": "not found"}))
