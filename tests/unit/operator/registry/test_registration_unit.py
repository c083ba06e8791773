"""registration.py and the clients' pure parts, without servers."""

from __future__ import annotations

import json

import pytest
from arbiter_operator.clients.registry import (
    Entity,
    from_custom_properties,
    to_custom_properties,
)
from arbiter_operator.clients.s3 import CredentialsInvalid, S3Credentials, credentials_from_secret, decode_secret_data
from arbiter_operator.observe.registry import registry_url_from_model_registry
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render.registry import (
    KEY_NAME,
    KEY_NAMESPACE,
    KEY_SLA_P95_MS,
    Owner,
    desired_model,
    foreign_owner,
    properties_patch,
    registered_condition,
    versions_to_archive,
)
from support.factory import make_dm


def test_desired_entries_carry_governance_metadata_and_provenance():
    dm = make_dm(model="credit", versions=["1.0.0", "2.0.0"], uid="u-1", generation=5, sla_ms=150)
    want = desired_model(dm)
    assert want.name == "credit"
    assert [v.name for v in want.versions] == ["1.0.0", "2.0.0"]
    v = want.versions[0]
    assert v.storage_uri == "s3://models/credit/1.0.0" and v.model_format == "safetensors"
    assert v.external_id == "arbiter:credit:1.0.0"
    assert v.artifact_external_id != v.external_id  # externalIds are unique across entity types
    assert json.loads(v.properties["arbiter.input_schema"]) == dm.spec.versions[0].metadata.inputSchema
    assert v.properties[KEY_SLA_P95_MS] == 150.0
    assert v.properties["arbiter.decisionmodel_uid"] == "u-1"
    assert v.properties["arbiter.decisionmodel_generation"] == 5


def test_typed_custom_properties_round_trip():
    plain = {"s": "text", "i": 7, "f": 0.5, "b": False}
    typed = to_custom_properties(plain)
    assert typed["s"] == {"metadataType": "MetadataStringValue", "string_value": "text"}
    assert typed["i"] == {"metadataType": "MetadataIntValue", "int_value": "7"}
    assert typed["f"]["metadataType"] == "MetadataDoubleValue"
    assert typed["b"] == {"metadataType": "MetadataBoolValue", "bool_value": False}
    assert from_custom_properties(typed) == plain


def test_properties_patch_only_when_something_changed_and_keeps_other_keys():
    desired = {"arbiter.x": "1", KEY_SLA_P95_MS: 150.0}
    current = {**to_custom_properties(desired), "approved-by": {"metadataType": "MetadataStringValue",
                                                                "string_value": "committee"}}
    assert properties_patch(current, desired) is None
    patched = properties_patch(current, {**desired, KEY_SLA_P95_MS: 90.0})
    assert patched["approved-by"]["string_value"] == "committee"
    assert patched[KEY_SLA_P95_MS]["double_value"] == 90.0
    # The server may return a double as written; 150 and 150.0 are the same value.
    server_form = {KEY_SLA_P95_MS: {"metadataType": "MetadataDoubleValue", "double_value": 150}}
    assert properties_patch(server_form, {KEY_SLA_P95_MS: 150.0}) is None


def version(name, state="LIVE", ns="team-a", dm="credit-limit"):
    props = {KEY_NAMESPACE: ns, KEY_NAME: dm} if ns else {}
    return Entity(id=name, name=name, state=state, custom_properties=props)


def test_only_own_live_versions_missing_from_the_spec_are_archived():
    owner = Owner("team-a", "credit-limit", "u", 1)
    existing = [version("1.0.0"), version("2.0.0"), version("0.9.0", state="ARCHIVED"),
                version("3.0.0", ns="team-b"), version("manual", ns=None)]
    assert [v.name for v in versions_to_archive(existing, {"2.0.0"}, owner)] == ["1.0.0"]
    assert [v.name for v in versions_to_archive(existing, set(), owner)] == ["1.0.0", "2.0.0"]


def test_foreign_owner():
    owner = Owner("team-a", "credit-limit", "u", 1)
    assert foreign_owner({KEY_NAMESPACE: "team-a", KEY_NAME: "credit-limit"}, owner) is None
    assert foreign_owner({}, owner) is None  # registered by hand: nobody to protect
    assert foreign_owner({KEY_NAMESPACE: "team-b", KEY_NAME: "credit-limit"}, owner) == "team-b/credit-limit"


def model_registry_obj(spec, hosts):
    return {"metadata": {"name": "modelregistry-public", "namespace": "rhoai-model-registries"},
            "spec": spec, "status": {"hosts": hosts} if hosts is not None else {}}


def test_registry_url_from_a_model_registry_resource():
    hosts = ["modelregistry-public-rest.apps.example.com", "modelregistry-public.rhoai-model-registries.svc"]
    with_proxy = model_registry_obj({"rest": {"port": 8080}, "kubeRBACProxy": {"port": 8443}}, hosts)
    assert registry_url_from_model_registry(with_proxy) == "https://modelregistry-public.rhoai-model-registries.svc:8443"
    plain = model_registry_obj({"rest": {"port": 8081}}, hosts)
    assert registry_url_from_model_registry(plain) == "http://modelregistry-public.rhoai-model-registries.svc:8081"
    by_str = {"spec": {}, "status": {"hostsStr": "a.ns.svc.cluster.local,b"}, "metadata": {}}
    assert registry_url_from_model_registry(by_str) == "http://a.ns.svc.cluster.local:8080"
    with pytest.raises(ValueError, match=r"no status\.hosts yet"):
        registry_url_from_model_registry(model_registry_obj({}, None))


def test_registered_condition_vocabulary():
    up = registered_condition(3, registered=["1.0.0"], now=utc_now())
    assert (up.type, up.status, up.reason, up.observedGeneration) == ("Registered", "True", "Registered", 3)
    down = registered_condition(3, unreachable="cannot reach the registry", now=utc_now())
    assert (down.status, down.reason) == ("Unknown", "RegistryUnreachable")
    no = registered_condition(3, rejected="401", now=utc_now())
    assert (no.status, no.reason) == ("False", "RegistryRejected")


def test_storage_config_entry_selection_and_overrides():
    entry = {"type": "s3", "access_key_id": "AK", "secret_access_key": "SK", "endpoint_url": "minio:9000",
             "verify_ssl": "0", "region": "eu-west-1"}
    data = {"models": json.dumps(entry), "default": json.dumps(dict(entry, region="us-east-1"))}
    by_bucket = credentials_from_secret(data, secret_name="storage-config", bucket="models")
    assert by_bucket.region == "eu-west-1"
    assert by_bucket.endpoint_url == "http://minio:9000"  # bare host + verify_ssl 0, as KServe reads it
    assert not by_bucket.verify_ssl
    by_default = credentials_from_secret(data, secret_name="storage-config", bucket="other")
    assert by_default.region == "us-east-1"
    explicit = credentials_from_secret(data, secret_name="storage-config", bucket="x", key="models",
                                       endpoint="https://s3.internal:443", region="r1", ca_bundle_pem="PEM")
    assert (explicit.endpoint_url, explicit.region, explicit.ca_bundle_pem) == ("https://s3.internal:443", "r1", "PEM")
    with pytest.raises(CredentialsInvalid, match="entries: default, models"):
        credentials_from_secret(data, secret_name="storage-config", bucket="x", key="nope")


def test_aws_style_data_connection_secret():
    creds = credentials_from_secret(
        {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_S3_ENDPOINT": "https://minio:9000",
         "AWS_DEFAULT_REGION": "us-east-1", "AWS_S3_BUCKET": "models"},
        secret_name="aws-connection-models", bucket="models",
    )
    assert (creds.access_key_id, creds.endpoint_url, creds.default_bucket) == ("AK", "https://minio:9000", "models")


def test_credentials_never_show_in_repr_or_errors():
    creds = S3Credentials(access_key_id="AKIAEXAMPLE", secret_access_key="very-secret", endpoint_url="http://x")
    assert "very-secret" not in repr(creds) and "AKIAEXAMPLE" not in repr(creds)
    with pytest.raises(CredentialsInvalid) as err:
        credentials_from_secret({"models": json.dumps({"type": "s3", "secret_access_key": "very-secret"})},
                                secret_name="s", bucket="models")
    assert "very-secret" not in str(err.value)
    with pytest.raises(CredentialsInvalid):
        decode_secret_data({"models": "%%%not base64"})


def test_decision_bounds_a_version_promises_are_recorded_only_when_set():
    dm = make_dm(model="credit", versions=["1.0.0"], uid="u-1", generation=1, sla_ms=150)
    assert not any(k.startswith("arbiter.sla_max") for k in desired_model(dm).versions[0].properties)
    sla = dm.spec.versions[0].metadata.sla
    dm.spec.versions[0].metadata.sla = sla.model_copy(update={"maxFallbackRate": 0.02, "maxLowConfidenceRate": 0.3})
    props = desired_model(dm).versions[0].properties
    assert props["arbiter.sla_max_fallback_rate"] == 0.02 and props["arbiter.sla_max_low_confidence_rate"] == 0.3
    assert "arbiter.sla_max_schema_violation_rate" not in props
