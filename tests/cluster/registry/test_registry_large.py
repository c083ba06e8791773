"""Large metadata against the real Model Registry (v0.3.0 on PostgreSQL): schemas too large for a custom property
are registered by reference with their digest, and a value the registry refuses for good is a permanent condition
(`RegistrationRejected`), not an outage retried forever."""

from __future__ import annotations

import hashlib
import json
import random
import string
import uuid
from datetime import UTC, datetime

import pytest
from arbiter_operator.clients.registry import permanent_refusal
from arbiter_operator.plan.recheck import recheck_after
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render.registry import KEY_INPUT_SCHEMA, KEY_OUTPUT_SCHEMA, MAX_PROPERTY_BYTES, fitted
from arbiter_operator.sync.registry import sync_registry
from hypothesis import given, settings
from hypothesis import strategies as st
from support.factory import make_dm

ASYNC = pytest.mark.asyncio(loop_scope="session")  # the session-scoped registry fixtures' loop


def _noise(n: int, seed: int) -> str:
    """Text that does not compress (PostgreSQL compresses before its index size check: repetition would pass)."""
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(n))


def _large_schema(kb: int) -> dict:
    return {"type": "object", "properties": {f"f{i}": {"type": "string", "description": _noise(1000, i)}
                                             for i in range(kb)}}


@ASYNC
async def test_large_schemas_are_registered_by_reference_with_their_digest(registry_client):
    model = f"credit-{uuid.uuid4().hex[:8]}"
    dm = make_dm(model=model, versions=["1.0.0"])
    raw = dm.model_dump(mode="json", by_alias=True, exclude_none=True)
    schema = _large_schema(40)  # ~40 KB, far over the ~2.7 KB the registry's index takes
    raw["spec"]["versions"][0]["metadata"]["inputSchema"] = schema
    dm = type(dm).model_validate(raw)

    result = await sync_registry(registry_client, dm, now=utc_now())
    assert result.ok, result.condition.message
    mv = await registry_client.find_model_version(external_id=f"arbiter:{model}:1.0.0")
    ref = json.loads(mv.custom_properties[KEY_INPUT_SCHEMA])
    text = json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()
    assert ref == {"$ref": "kubernetes:///apis/arbiter.dev/v1alpha1/namespaces/team-a/decisionmodels/credit-limit"
                           "#spec.versions[name=1.0.0].metadata.inputSchema",
                   "sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
    # A schema that fits is still registered inline.
    assert json.loads(mv.custom_properties[KEY_OUTPUT_SCHEMA]) == dm.spec.versions[0].metadata.outputSchema

    again = await sync_registry(registry_client, dm, now=utc_now())  # converged: nothing created or changed
    assert again.ok and not again.created and not again.updated


@ASYNC
async def test_a_value_the_registry_refuses_for_good_is_registration_rejected_and_not_retried(registry_client):
    dm = make_dm(model=f"credit-{uuid.uuid4().hex[:8]}", versions=["1.0.0"])
    raw = dm.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["spec"]["model"]["description"] = _noise(4000, 7)  # the CRD allows 4096 characters; the index does not
    dm = type(dm).model_validate(raw)

    result = await sync_registry(registry_client, dm, now=utc_now())
    cond = result.condition
    assert (cond.status, cond.reason) == ("False", "RegistrationRejected")
    assert "exceeds btree" in cond.message and "retrying cannot help" in cond.message
    # Permanent: no recheck is scheduled for it (an outage, Unknown, would be).
    assert recheck_after([cond], datetime.now(UTC)) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=6000))
def test_no_property_sent_is_over_the_limit(text: str) -> None:
    out = fitted(text, "kubernetes:///apis/arbiter.dev/v1alpha1/namespaces/n/decisionmodels/m#x")
    assert len(out.encode()) <= MAX_PROPERTY_BYTES
    if len(text.encode()) <= MAX_PROPERTY_BYTES:
        assert out == text
    else:
        assert json.loads(out)["sha256"] == hashlib.sha256(text.encode()).hexdigest()


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=500, max_value=599), st.text(max_size=300))
def test_only_data_errors_are_permanent(status: int, message: str) -> None:
    """A hostile 5xx body is an outage (retried) unless it names a database data error."""
    markers = ("SQLSTATE 22", "SQLSTATE 54", "index row size", "index row requires", "value too long")
    if not any(m in message for m in markers):
        assert not permanent_refusal(status, message)
    assert permanent_refusal(status, message + " (SQLSTATE 54000)")
    assert not permanent_refusal(404, "index row size 4032 exceeds btree")
