"""sync_registry / archive_all against the real Kubeflow Model Registry (v0.3.0 on PostgreSQL).

Every exchange of Arbiter's client is validated against the registry's OpenAPI document (conftest's
`registry_client`). Each test uses its own model name, so tests share one registry without seeing each other.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from arbiter_devenv.registryserver import free_port
from arbiter_operator.clients.registry import RegistryClient
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render.registry import (
    KEY_BIAS_REPORT,
    KEY_GENERATION,
    KEY_INPUT_SCHEMA,
    KEY_NAME,
    KEY_NAMESPACE,
    KEY_OUTPUT_SCHEMA,
    KEY_SLA_P95_MS,
    KEY_TRAINING_FROM,
    KEY_TRAINING_TO,
    KEY_UID,
)
from arbiter_operator.sync.registry import archive_all, sync_registry
from support.factory import make_dm

# Same loop as the session-scoped fixtures (pyproject: asyncio_default_fixture_loop_scope = "session").
pytestmark = pytest.mark.asyncio(loop_scope="session")


def model_name() -> str:
    return f"credit-{uuid.uuid4().hex[:8]}"


async def entries(client: RegistryClient, model: str):
    """What the registry holds for `model`, read back independently of sync_registry's return value."""
    rm = await client.find_registered_model(name=model)
    versions = await client.list_model_versions(rm.id) if rm else []
    return rm, {v.name: v for v in versions}


async def test_register_creates_model_versions_and_artifacts_with_metadata(registry_client):
    model = model_name()
    dm = make_dm(model=model, versions=["1.0.0", "1.1.0"], sla_ms=120)

    result = await sync_registry(registry_client, dm, now=utc_now())

    assert result.condition.status == "True", result.condition.message
    assert result.condition.reason == "Registered"
    rm, versions = await entries(registry_client, model)
    assert rm is not None and set(versions) == {"1.0.0", "1.1.0"}
    for name, reg in result.versions.items():
        assert reg.registered_model_id == rm.id
        assert reg.model_version_id == versions[name].id
        art = await registry_client.get_model_artifact(reg.model_artifact_id)
        assert art.uri == f"s3://models/{model}/{name}"
        assert art.model_format_name == "safetensors"

    # Governance metadata and provenance round-trip in the registry's typed form.
    props = versions["1.0.0"].custom_properties
    spec_md = dm.spec.versions[0].metadata
    assert json.loads(props[KEY_INPUT_SCHEMA]) == spec_md.inputSchema
    assert json.loads(props[KEY_OUTPUT_SCHEMA]) == spec_md.outputSchema
    assert props[KEY_SLA_P95_MS] == 120.0
    assert (props[KEY_TRAINING_FROM], props[KEY_TRAINING_TO]) == ("2024-01-01", "2025-06-30")
    assert props[KEY_BIAS_REPORT] == f"https://governance.example.com/reports/{model}-1.0.0.html"
    assert (props[KEY_NAMESPACE], props[KEY_NAME], props[KEY_UID], props[KEY_GENERATION]) == (
        "team-a", "credit-limit", dm.metadata.uid, 1,
    )
    raw = versions["1.0.0"].raw["customProperties"]
    assert raw[KEY_SLA_P95_MS]["metadataType"] == "MetadataDoubleValue"
    assert raw[KEY_GENERATION] == {"metadataType": "MetadataIntValue", "int_value": "1"}


async def test_re_register_finds_entries_and_writes_nothing(registry_client):
    model = model_name()
    dm = make_dm(model=model, versions=["1.0.0", "2.0.0"])
    first = await sync_registry(registry_client, dm, now=utc_now())
    assert first.ok and len(first.created) == 5  # model + 2 versions + 2 artifacts

    again = await sync_registry(registry_client, dm, now=utc_now())

    assert again.ok
    assert again.created == [] and again.updated == []
    assert again.versions == first.versions  # same ids: found, not duplicated
    _, versions = await entries(registry_client, model)
    assert sorted(versions) == ["1.0.0", "2.0.0"]


async def test_spec_change_updates_entries_in_place(registry_client):
    model = model_name()
    first = await sync_registry(registry_client, make_dm(model=model, versions=["1.0.0"], sla_ms=150), now=utc_now())

    changed = make_dm(model=model, versions={"1.0.0": f"s3://models/{model}/1.0.0-retrained"}, sla_ms=90, generation=2)
    second = await sync_registry(registry_client, changed, now=utc_now())

    assert second.ok and second.created == []
    assert second.versions["1.0.0"] == first.versions["1.0.0"]
    _, versions = await entries(registry_client, model)
    assert versions["1.0.0"].custom_properties[KEY_SLA_P95_MS] == 90.0
    assert versions["1.0.0"].custom_properties[KEY_GENERATION] == 2
    art = await registry_client.get_model_artifact(second.versions["1.0.0"].model_artifact_id)
    assert art.uri == f"s3://models/{model}/1.0.0-retrained"


async def test_properties_added_by_people_survive_a_sync(registry_client):
    model = model_name()
    first = await sync_registry(registry_client, make_dm(model=model, versions=["1.0.0"]), now=utc_now())
    mv_id = first.versions["1.0.0"].model_version_id
    _, versions = await entries(registry_client, model)
    props = dict(versions["1.0.0"].raw["customProperties"])
    props["approved-by"] = {"metadataType": "MetadataStringValue", "string_value": "risk-committee"}
    await registry_client.update_model_version(mv_id, {"customProperties": props})

    await sync_registry(registry_client, make_dm(model=model, versions=["1.0.0"], sla_ms=99, generation=2),
        now=utc_now())

    _, versions = await entries(registry_client, model)
    assert versions["1.0.0"].custom_properties["approved-by"] == "risk-committee"
    assert versions["1.0.0"].custom_properties[KEY_SLA_P95_MS] == 99.0


async def test_version_removed_from_spec_is_archived_not_deleted_and_comes_back(registry_client):
    model = model_name()
    await sync_registry(registry_client, make_dm(model=model, versions=["1.0.0", "2.0.0"]), now=utc_now())

    result = await sync_registry(registry_client, make_dm(model=model, versions=["2.0.0"], generation=2), now=utc_now())

    assert result.ok and result.archived == ["1.0.0"]
    assert set(result.versions) == {"2.0.0"}
    _, versions = await entries(registry_client, model)
    assert versions["1.0.0"].state == "ARCHIVED"
    assert versions["2.0.0"].state == "LIVE"

    # Put back into the spec: the same entry goes LIVE again.
    back = await sync_registry(registry_client, make_dm(model=model, versions=["1.0.0", "2.0.0"], generation=3),
        now=utc_now())
    _, versions = await entries(registry_client, model)
    assert versions["1.0.0"].state == "LIVE"
    assert back.versions["1.0.0"].model_version_id == versions["1.0.0"].id


async def test_delete_archives_every_version_and_the_model(registry_client):
    model = model_name()
    dm = make_dm(model=model, versions=["1.0.0", "2.0.0"])
    await sync_registry(registry_client, dm, now=utc_now())

    result = await archive_all(registry_client, dm, now=utc_now())

    assert result.ok, result.condition.message
    assert sorted(result.archived) == ["1.0.0", "2.0.0", f"RegisteredModel {model}"]
    rm, versions = await entries(registry_client, model)
    assert rm.state == "ARCHIVED"
    assert {v.state for v in versions.values()} == {"ARCHIVED"}
    # The audit trail stays: metadata is still readable.
    assert versions["1.0.0"].custom_properties[KEY_UID] == dm.metadata.uid
    # A second finalizer run (operator restarted mid-delete) has nothing left to do and still succeeds.
    again = await archive_all(registry_client, dm, now=utc_now())
    assert again.ok and again.archived == []


async def test_recreated_decision_model_takes_its_archived_entries_back(registry_client):
    model = model_name()
    old = make_dm(model=model, versions=["1.0.0"], uid="uid-old")
    first = await sync_registry(registry_client, old, now=utc_now())
    await archive_all(registry_client, old, now=utc_now())

    new = make_dm(model=model, versions=["1.0.0"], uid="uid-new")  # same namespace/name, new object
    result = await sync_registry(registry_client, new, now=utc_now())

    assert result.ok and result.created == []
    assert result.versions["1.0.0"].model_version_id == first.versions["1.0.0"].model_version_id
    rm, versions = await entries(registry_client, model)
    assert rm.state == "LIVE" and versions["1.0.0"].state == "LIVE"
    assert versions["1.0.0"].custom_properties[KEY_UID] == "uid-new"


async def test_other_decision_models_versions_are_left_alone(registry_client):
    model = model_name()
    team_a = make_dm(model=model, versions=["1.0.0"], namespace="team-a", uid="uid-a")
    team_b = make_dm(model=model, versions=["2.0.0"], namespace="team-b", uid="uid-b")
    await sync_registry(registry_client, team_a, now=utc_now())
    await sync_registry(registry_client, team_b, now=utc_now())

    # team-b removing its versions or being deleted archives nothing of team-a's.
    await archive_all(registry_client, team_b, now=utc_now())
    rm, versions = await entries(registry_client, model)
    assert versions["1.0.0"].state == "LIVE" and versions["2.0.0"].state == "ARCHIVED"
    assert rm.state == "LIVE"  # still holds team-a's live version

    # team-b claiming team-a's live version is refused, with who owns it.
    clash = await sync_registry(registry_client,
                                make_dm(model=model, versions=["1.0.0"], namespace="team-b", uid="uid-b"),
                                    now=utc_now())
    assert clash.condition.status == "False"
    assert clash.condition.reason == "RegistryRejected"
    assert "team-a/credit-limit" in clash.condition.message
    _, versions = await entries(registry_client, model)
    assert versions["1.0.0"].custom_properties[KEY_NAMESPACE] == "team-a"


async def test_registry_unreachable_is_unknown_and_keeps_the_token_secret():
    token = "tok-" + uuid.uuid4().hex
    dead = f"http://127.0.0.1:{free_port()}"
    async with RegistryClient(dead, token=token, timeout=2) as client:
        result = await sync_registry(client, make_dm(model=model_name(), versions=["1.0.0"]), now=utc_now())
        deleted = await archive_all(client, make_dm(model=model_name(), versions=["1.0.0"]), now=utc_now())

    for r in (result, deleted):
        assert r.condition.status == "Unknown"
        assert r.condition.reason == "RegistryUnreachable"
        assert "Serving is not affected" in r.condition.message
        assert token not in r.condition.message
    assert result.versions == {}


async def test_registry_outage_then_recovery(model_registry, openapi_doc):
    model = model_name()
    dm = make_dm(model=model, versions=["1.0.0"])
    async with RegistryClient(model_registry.url, timeout=3) as client:
        model_registry.pause()
        try:
            down = await sync_registry(client, dm, now=utc_now())
        finally:
            model_registry.resume()
        up = await sync_registry(client, dm, now=utc_now())

    assert down.condition.status == "Unknown" and down.condition.reason == "RegistryUnreachable"
    assert up.condition.status == "True"
    assert up.versions["1.0.0"].model_version_id


async def test_bearer_token_is_sent_and_never_redirected(model_registry, openapi_doc):
    seen: list[str | None] = []

    class Spy(httpx.AsyncBaseTransport):
        def __init__(self):
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            seen.append(request.headers.get("authorization"))
            return await self.inner.handle_async_request(request)

    async with RegistryClient(model_registry.url, token="abc.def", transport=Spy()) as client:
        result = await sync_registry(client, make_dm(model=model_name(), versions=["1.0.0"]), now=utc_now())
    assert result.ok
    assert seen and set(seen) == {"Bearer abc.def"}


async def test_every_exchange_matched_the_openapi_document(registry_client, openapi_doc):
    """Runs the whole lifecycle through the validating transport; any contract violation fails inside."""
    model = model_name()
    dm = make_dm(model=model, versions=["1.0.0", "2.0.0"])
    await sync_registry(registry_client, dm, now=utc_now())
    await sync_registry(registry_client, make_dm(model=model, versions=["2.0.0"], generation=2, sla_ms=80),
        now=utc_now())
    await archive_all(registry_client, dm, now=utc_now())
    assert registry_client.transport.exchanges >= 10
    used = {(m, t) for m, t, _ in openapi_doc.seen}
    for op in [
        ("POST", "/api/model_registry/v1alpha3/registered_models"),
        ("POST", "/api/model_registry/v1alpha3/model_versions"),
        ("PATCH", "/api/model_registry/v1alpha3/model_versions/{modelversionId}"),
        ("POST", "/api/model_registry/v1alpha3/model_versions/{modelversionId}/artifacts"),
        ("GET", "/api/model_registry/v1alpha3/model_version"),
        ("GET", "/api/model_registry/v1alpha3/model_artifact"),
    ]:
        assert op in used
