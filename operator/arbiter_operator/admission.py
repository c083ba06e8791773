"""The operator's validating admission webhook: what the operator refuses a DecisionModel for and the CRD's CEL cannot
express (vLLM flags in every spelling, schemas that are not JSON Schema or that no decision satisfies, fallback rules
that are not CEL, the KServe host-name limit of the request's namespace, a decision.json the runtime would refuse or
that no ConfigMap can hold) is refused at `oc apply`, in the apiserver's answer, instead of minutes later in the
status. The same function judges both (plan.validate.spec_problems), so the webhook never refuses what the reconcile
would take, nor the reverse.

kopf serves it: a `@kopf.on.validate` handler on kopf's own WebhookServer (TLS from the certificate files the chart
mounts, re-read when they rotate). What Arbiter adds is the decoding in front of kopf's handler
(BoundedWebhookServer), for the reason its informer decodes on its own: kopf's server reads the body with aiohttp's
1 MiB limit and decodes it with the standard `json`, so an object nested 1,000 levels deep raises RecursionError there
(answered 500, measured) and kopf's diff of old and new recurses once per level. Here the body is read up to
MAX_REVIEW_BYTES, decoded by orjson (no recursion; it refuses more than 1,024 levels), an AdmissionReview that is not
one is answered 400 naming what is missing, and an object nested deeper than MAX_OBJECT_DEPTH is refused with the
same message the reconcile's status would give, before kopf's machinery walks it.

Failure policy (the chart's ValidatingWebhookConfiguration): Ignore, with a 5 s timeout. While no operator pod
answers (an upgrade, an outage) a team's `oc apply` and Argo CD's sync still go through, and the reconcile refuses
what the webhook would have (Stalled=True, InvalidSpec): the status path is the backstop, never a second opinion.

Only a change of the spec is judged: an update that leaves the spec alone (a finalizer, a label, the operator's own
writes) and an object being deleted are always admitted, so an object admitted while the webhook was away can still
be labelled, finalized and deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
import orjson
from pydantic import ValidationError

from .api import jsonscan
from .api.kubejson import REFUSED
from .api.models import MAX_SCHEMA_DEPTH, DecisionModel, schema_depth
from .api.names import GROUP, PLURAL, VERSION
from .plan.validate import spec_problems
from .refuse import invalid_message, undecodable_message

log = logging.getLogger("arbiter.admission")

# The handler's id is the webhook's URL path (kopf routes POST /<handler id> to that handler).
HANDLER_ID = "decisionmodels"
PATH = f"/{HANDLER_ID}"
# The apiserver refuses an object over 3 MiB; a review of an update carries it twice, plus the request's metadata.
MAX_REVIEW_BYTES = 8 * 1024 * 1024
# A DecisionModel's deepest legitimate value is a version's schema (spec.versions[i].metadata.outputSchema, six
# levels down, then MAX_SCHEMA_DEPTH). Up to twice that, the API's own validation names the field and its limit;
# deeper is refused unread (kopf's diff recurses once per level).
MAX_OBJECT_DEPTH = 2 * MAX_SCHEMA_DEPTH
TOO_DEEP = f"nested deeper than {MAX_OBJECT_DEPTH} levels"


@dataclass(frozen=True)
class WebhookConfig:
    """Where the webhook listens and which certificate it presents (tls.crt and tls.key in `cert_dir`)."""

    port: int
    cert_dir: Path
    address: str = "0.0.0.0"


def problems(raw: Mapping[str, Any]) -> list[str]:
    """Why this DecisionModel must not be admitted ([]: admit): its API's validation, then the operator's checks."""
    try:
        dm = DecisionModel.model_validate(dict(raw))
    except ValidationError as exc:
        return [invalid_message(exc)]
    found = spec_problems(dm)
    return [("; ".join(found) + ". Nothing was changed: fix the spec to continue.")] if found else []


def review(body: Mapping[str, Any], old: Mapping[str, Any] | None, operation: str | None,
           subresource: str | None) -> str | None:
    """The refusal message for one admission request, or None to admit it."""
    if subresource or operation not in ("CREATE", "UPDATE"):
        return None  # the status is the operator's own write; deletion is never refused
    meta = body.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return None  # being deleted: its finalizer must be removable whatever the spec says
    if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return None  # nothing the checks read has changed
    found = problems(body)
    return found[0] if found else None


def register(registry: kopf.OperatorRegistry) -> None:
    """The validating handler, on `registry`; the server is BoundedWebhookServer (see configure)."""

    @kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, registry=registry)  # type: ignore[arg-type]
    def validate(body: kopf.Body, old: Mapping[str, Any] | None, operation: str | None, subresource: str | None,
                 **_: Any) -> None:
        message = review(body, old, operation, subresource)
        if message is not None:
            meta = body.get("metadata", {})
            log.info("refused %s of DecisionModel %s/%s at admission: %s", operation, meta.get("namespace"),
                     meta.get("name"), message[:300])
            raise kopf.AdmissionError(message, code=422)


def configure(settings: kopf.OperatorSettings, webhook: WebhookConfig) -> None:
    """kopf serves the webhook; the chart (or OLM) owns the ValidatingWebhookConfiguration, so kopf manages none:
    patching webhook configurations would need a cluster-wide grant the operator otherwise never uses."""
    settings.admission.server = BoundedWebhookServer(
        addr=webhook.address, port=webhook.port, path="",
        certfile=webhook.cert_dir / "tls.crt", pkeyfile=webhook.cert_dir / "tls.key")
    settings.admission.managed = None


def _answer(uid: str, message: str, api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": False, "status": {"code": 422, "reason": "Invalid", "message": message}}}


def _bad(reason: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({"error": reason}, status=400)


def _uid_of(data: bytes) -> str | None:
    """request.uid of a review too deep to decode, found without decoding the rest (jsonscan)."""
    top = jsonscan.members(data)
    if not top or "request" not in top:
        return None
    request = jsonscan.members(data, *top["request"])
    if not request or "uid" not in request:
        return None
    try:
        uid = orjson.loads(data[slice(*request["uid"])])
    except orjson.JSONDecodeError:
        return None
    return uid if isinstance(uid, str) else None


def shape_problem(doc: Any) -> str | None:
    """What an AdmissionReview lacks for kopf to dispatch it (kopf would answer 500 with a KeyError)."""
    if not isinstance(doc, dict):
        return "the body is not a JSON object"
    request = doc.get("request")
    if not isinstance(request, dict):
        return "request is not an object"
    if not isinstance(request.get("uid"), str):
        return "request.uid is not a string"
    resource = request.get("resource")
    if not isinstance(resource, dict) or (resource.get("group"), resource.get("resource")) != (GROUP, PLURAL) \
            or not isinstance(resource.get("version"), str):
        return f"request.resource is not {PLURAL}.{GROUP}, the only resource this webhook reviews"
    if not isinstance(request.get("userInfo"), dict):
        return "request.userInfo is not an object"
    if not any(isinstance(request.get(k), dict) for k in ("object", "oldObject")):
        return "request carries neither object nor oldObject"
    for key in ("operation", "subResource", "namespace"):
        if request.get(key) is not None and not isinstance(request.get(key), str):
            return f"request.{key} is not a string"
    return None


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's WebhookServer with the operator's bounded decoding in front of kopf's handler (module docstring)."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        data = bytearray()
        while chunk := await request.content.read(65536):
            data += chunk
            if len(data) > MAX_REVIEW_BYTES:
                return aiohttp.web.json_response({"error": f"the review exceeds {MAX_REVIEW_BYTES} bytes"}, status=413)
        body = bytes(data)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            uid = _uid_of(body) if "recursion" in str(exc).lower() or "depth" in str(exc).lower() else None
            if uid is None:
                return _bad(f"the body is not a JSON AdmissionReview: {exc}")
            return aiohttp.web.json_response(_answer(uid, undecodable_message({REFUSED: "JSON nested too deep"})))
        problem = shape_problem(doc)
        if problem:
            return _bad(f"not an AdmissionReview: {problem}")
        request_ = doc["request"]
        api_version = doc.get("apiVersion") if isinstance(doc.get("apiVersion"), str) else "admission.k8s.io/v1"
        if isinstance(request_.get("object"), dict) and schema_depth(request_["object"], MAX_OBJECT_DEPTH) > \
                MAX_OBJECT_DEPTH:
            return aiohttp.web.json_response(_answer(request_["uid"], undecodable_message({REFUSED: TOO_DEEP}),
                                                     api_version))
        if isinstance(request_.get("oldObject"), dict) and schema_depth(request_["oldObject"], MAX_OBJECT_DEPTH) > \
                MAX_OBJECT_DEPTH:
            # Admitted while the webhook was away: its fix must go through, and kopf's diff must not walk it.
            request_["oldObject"] = None
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response = await fn(doc, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers)
        except Exception as exc:  # kopf's dispatch (the API not yet discovered): the failure policy decides, not a 500
            log.warning("admission review not served: %s", exc)
            return aiohttp.web.json_response({"error": f"the review could not be served yet: {exc}"}, status=503)
        return aiohttp.web.Response(body=orjson.dumps(response), content_type="application/json")
