"""Validate HTTP exchanges against the Model Registry's own OpenAPI document (v0.3.0).

`ValidatingTransport` wraps httpx's transport: every request Arbiter's client sends and every response the real
registry returns is checked against the operation the document declares for that method and path (path exists,
query parameters declared, request body and response body match their schemas, the status code is documented).
A mismatch raises `ContractViolation`, which fails the test that caused it.

OpenAPI 3.0 `oneOf` + `discriminator` is turned into JSON Schema `if/then` on the discriminator property (plain
`oneOf` would be ambiguous: several artifact types have no required field), then jsonschema's Draft 7 validator runs.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any
from urllib.parse import parse_qsl

import httpx
import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

DOC_PATH = pathlib.Path(__file__).with_name("model-registry-v0.3.0.openapi.yaml")
ROOT = "urn:model-registry-openapi"


class ContractViolation(AssertionError):
    pass


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _convert(v) for k, v in node.items() if k not in ("discriminator", "example", "examples")}
    disc = node.get("discriminator")
    if disc and "oneOf" in node:
        prop = disc["propertyName"]
        mapping = disc.get("mapping", {})
        del out["oneOf"]
        out["required"] = sorted(set(out.get("required", [])) | {prop})
        out.setdefault("properties", {})[prop] = {"enum": sorted(mapping)}
        out["allOf"] = out.get("allOf", []) + [
            {"if": {"properties": {prop: {"const": value}}}, "then": {"$ref": ref}} for value, ref in mapping.items()
        ]
    if "$ref" in out and out["$ref"].startswith("#"):
        out["$ref"] = ROOT + out["$ref"]
    return out


class OpenApiDoc:
    def __init__(self, path: pathlib.Path = DOC_PATH):
        self.raw = yaml.safe_load(path.read_text())
        self.doc = _convert(self.raw)
        self.registry = Registry().with_resource(ROOT, Resource(contents=self.doc, specification=DRAFT7))
        self._templates = [
            (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$"), p) for p in self.raw["paths"]
        ]
        self.seen: set[tuple[str, str, int]] = set()  # (method, template, status) exchanged in this session
        self._validators: dict[int, tuple[Any, jsonschema.Draft7Validator]] = {}

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            parts = node["$ref"].split("#/", 1)[1].split("/")
            cur: Any = self.raw
            for p in parts:
                cur = cur[p]
            node = cur
        return node

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        for rx, template in self._templates:
            if rx.match(path):
                item = self.raw["paths"][template]
                op = item.get(method.lower())
                if op is None:
                    raise ContractViolation(f"{method} {path}: the document has no {method} on {template}")
                params = [self._resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]
                return template, op, params
        raise ContractViolation(f"{method} {path}: no such path in the registry's OpenAPI document")

    def validate(self, instance: Any, schema: dict[str, Any], what: str) -> None:
        cached = self._validators.get(id(schema))
        if cached is None or cached[0] is not schema:  # keep `schema` referenced so its id stays unique
            cached = (schema, jsonschema.Draft7Validator(_convert(schema), registry=self.registry))
            self._validators[id(schema)] = cached
        validator = cached[1]
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
        if errors:
            msgs = "; ".join(f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message[:300]}" for e in errors[:5])
            raise ContractViolation(f"{what} does not match the OpenAPI document: {msgs}")

    def check_request(self, method: str, path: str, query: str, body: bytes) -> str:
        template, op, params = self.operation(method, path)
        declared = {p["name"]: p for p in params if p.get("in") == "query"}
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name not in declared:
                raise ContractViolation(f"{method} {template}: query parameter {name!r} is not declared")
            self.validate(value, declared[name].get("schema", {}), f"{method} {template} ?{name}")
        if "requestBody" in op:
            content = op["requestBody"]["content"]["application/json"]["schema"]
            if not body:
                raise ContractViolation(f"{method} {template}: request body is required")
            self.validate(json.loads(body), content, f"{method} {template} request body")
        elif body:
            raise ContractViolation(f"{method} {template}: sends a body the operation does not take")
        return template

    def check_response(self, method: str, template: str, status: int, body: bytes) -> None:
        op = self.raw["paths"][template][method.lower()]
        declared = op.get("responses", {})
        resp = declared.get(str(status)) or declared.get("default")
        if resp is None:
            raise ContractViolation(
                f"{method} {template}: status {status} is not documented (documented: {', '.join(declared)})"
            )
        self.seen.add((method, template, status))
        resp = self._resolve(resp)
        schema = (resp.get("content") or {}).get("application/json", {}).get("schema")
        if schema is None:
            return
        try:
            payload = json.loads(body)
        except ValueError:
            raise ContractViolation(f"{method} {template} {status}: body is not JSON: {body[:200]!r}") from None
        self.validate(payload, schema, f"{method} {template} {status} response")


class ValidatingTransport(httpx.AsyncBaseTransport):
    def __init__(self, doc: OpenApiDoc, inner: httpx.AsyncBaseTransport | None = None):
        self.doc = doc
        self.inner = inner or httpx.AsyncHTTPTransport()
        self.exchanges = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        template = self.doc.check_request(request.method, request.url.path, request.url.query.decode(), body)
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        self.doc.check_response(request.method, template, response.status_code, content)
        self.exchanges += 1
        # The body is already decoded: drop the headers that describe the wire form.
        wire = ("content-encoding", "content-length", "transfer-encoding")
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in wire]
        return httpx.Response(status_code=response.status_code, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()
