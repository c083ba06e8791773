"""The artifact check reads a storage-config entry without keys with the operator's own AWS credentials, from
botocore's own chain: a web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE) exchanged at STS, refreshed before
it expires with the token file read afresh. STS here is a hostile peer on loopback (support/hostile_sts.py) speaking
STS's wire format, S3 another (support/hostile_s3.py); botocore's real chain and signer run. Whatever STS does (refuses
the token, fails, stalls, answers what is not STS), the check's verdict stays Unknown and names what to fix, never a
crash, never a settled verdict, never a credential in the message. The same against a real S3 server's STS:
tests/cluster/registry/test_web_identity_s3.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import pytest
from arbiter_operator.clients.s3 import (
    CredentialsInvalid,
    OwnCredentials,
    S3Credentials,
    S3Storage,
    StorageUnreachable,
    credentials_from_secret,
)
from arbiter_operator.observe.storage import check_version_artifacts
from arbiter_operator.plan.artifacts import STORAGE_CREDENTIALS_INVALID, STORAGE_UNREACHABLE, serving_ask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.factory import make_dm
from support.hostile_s3 import Answer, HostileS3, listing_xml
from support.hostile_sts import HostileSTS, granted, issue, sts_error_xml

ROLE = "arn:aws:iam::123456789012:role/models-reader"
CONFIG = b'{"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 8192}'


@pytest.fixture(scope="module")
def sts():
    peer = HostileSTS().start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def s3():
    peer = HostileS3().start()
    yield peer
    peer.stop()


@pytest.fixture
def web_identity(sts, s3, tmp_path, monkeypatch):
    """The operator's environment as the chart renders it for a web identity, and nothing else botocore could find."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_ROLE_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    token = tmp_path / "token"
    token.write_text("first.service-account.token")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries would only slow the failure cases down
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ROLE_ARN", ROLE)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.endpoint_url)
    sts.reset(lambda call: granted(issue()))
    s3.reset(lambda request: Answer(200, CONFIG))
    return token


def _entry(s3: HostileS3, own: OwnCredentials | None) -> S3Credentials:
    secret = {"models": f'{{"type": "s3", "endpoint_url": "{s3.endpoint_url}", "region": "us-east-1"}}'}
    return credentials_from_secret(secret, secret_name="storage-config", bucket="models", own=own)


def _key_id(request) -> str:  # type: ignore[no-untyped-def]
    return re.search(r"Credential=([^/]+)/", request.headers["authorization"]).group(1)


async def test_an_entry_without_keys_is_read_with_the_web_identity_exchanged_at_sts(web_identity, sts, s3):
    issued = issue()
    sts.reset(lambda call: granted(issued))
    async with S3Storage(_entry(s3, OwnCredentials())) as storage:
        assert await storage.get_bytes("models", "credit/config.json") == CONFIG
        assert await storage.get_bytes("models", "credit/config.json") == CONFIG
    [call] = sts.calls  # exchanged once, used for both reads
    assert call["Action"] == "AssumeRoleWithWebIdentity" and call["RoleArn"] == ROLE
    assert call["WebIdentityToken"] == "first.service-account.token"
    assert all(_key_id(r) == issued.access_key for r in s3.requests)
    assert all(r.headers["x-amz-security-token"] == issued.session_token for r in s3.requests)


async def test_credentials_about_to_expire_are_exchanged_again_with_the_rotated_token(web_identity, sts, s3):
    # Five minutes left: inside botocore's mandatory refresh window, so every use exchanges again.
    first, second = issue(dt.timedelta(minutes=5)), issue()
    answers = iter([granted(first), granted(second)])
    sts.reset(lambda call: next(answers))
    own = OwnCredentials()
    async with S3Storage(_entry(s3, own)) as storage:
        await storage.get_bytes("models", "credit/config.json")
        web_identity.write_text("second.service-account.token")  # the kubelet rotated the projected token
        await storage.get_bytes("models", "credit/config.json")
    assert [c["WebIdentityToken"] for c in sts.calls] == ["first.service-account.token",
                                                           "second.service-account.token"]
    assert [_key_id(r) for r in s3.requests] == [first.access_key, second.access_key]


@pytest.mark.parametrize("code", ["InvalidIdentityToken", "ExpiredTokenException", "AccessDenied"])
async def test_a_token_sts_refuses_is_an_unknown_verdict_that_names_it_and_passes_once_accepted(
        web_identity, sts, s3, code):
    sts.reset(lambda call: Answer(400, sts_error_xml(code, "Token is expired or invalid")))
    dm = make_dm()
    own = OwnCredentials()
    async with S3Storage(_entry(s3, own)) as storage:
        report = await check_version_artifacts(storage, "s3://models/credit", serving_ask(dm.spec))
        assert (report.status, report.reason) == ("Unknown", STORAGE_CREDENTIALS_INVALID)
        assert code in report.message and "AWS_WEB_IDENTITY_TOKEN_FILE" in report.message
        assert "AWS_ROLE_ARN" in report.message and "first.service-account.token" not in report.message
        assert s3.requests == []  # nothing unsigned went to S3
        # The token is fixed (rotated, or the trust policy corrected): the next check passes.
        sts.reset(lambda call: granted(issue()))
        s3.reset(lambda request: Answer(200, listing_xml([("credit/config.json", len(CONFIG))], prefix="credit/"))
                 if "list-type" in request.query else Answer(200, CONFIG))
        report = await check_version_artifacts(storage, "s3://models/credit", serving_ask(dm.spec))
    assert report.reason != STORAGE_CREDENTIALS_INVALID and report.status in ("True", "False")


@pytest.mark.parametrize("answer", [Answer(500, sts_error_xml("InternalError")),
                                    Answer(400, sts_error_xml("Throttling")),
                                    Answer(503, b"<html>busy</html>", headers=[("Content-Type", "text/html")])])
async def test_a_failing_sts_is_storage_unreachable(web_identity, sts, s3, answer):
    sts.reset(lambda call: answer)
    dm = make_dm()
    async with S3Storage(_entry(s3, OwnCredentials())) as storage:
        report = await check_version_artifacts(storage, "s3://models/credit", serving_ask(dm.spec))
    assert (report.status, report.reason) == ("Unknown", STORAGE_UNREACHABLE)
    assert "the operator's AWS credentials (assume-role-with-web-identity)" in report.message


async def test_an_sts_that_does_not_answer_holds_a_check_no_longer_than_the_deadline_and_is_asked_once(
        web_identity, sts, s3):
    sts.reset(lambda call: Answer(200, b"", stall=30))
    own = OwnCredentials(deadline=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(own.frozen() for _ in range(5)), return_exceptions=True)
    assert loop.time() - started < 5
    assert all(isinstance(r, StorageUnreachable) and "no answer from STS within 1 s" in str(r) for r in results)
    assert len(sts.calls) == 1  # the five waiters shared one exchange


async def test_a_missing_token_file_names_the_projected_volume(web_identity, s3):
    web_identity.unlink()
    with pytest.raises(CredentialsInvalid, match="cannot read AWS_WEB_IDENTITY_TOKEN_FILE"):
        await OwnCredentials().frozen()


async def test_no_credentials_anywhere_says_so(web_identity, monkeypatch):
    for name in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name)
    with pytest.raises(CredentialsInvalid, match="the operator has no AWS credentials of its own"):
        await OwnCredentials().frozen()


async def test_environment_keys_are_found_by_the_chain_too(web_identity, monkeypatch, sts, s3):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    async with S3Storage(_entry(s3, OwnCredentials())) as storage:
        await storage.get_bytes("models", "credit/config.json")
    assert sts.calls == [] and [_key_id(r) for r in s3.requests] == ["AKIAENVIRONMENT"]


def test_an_entry_without_keys_is_refused_unless_the_operator_was_installed_with_its_own():
    with pytest.raises(CredentialsInvalid, match=r"aws\.ownCredentials"):
        _entry(HostileS3(), None)
    half = {"models": '{"type": "s3", "access_key_id": "AKIA"}'}
    with pytest.raises(CredentialsInvalid, match="only one of access_key_id/secret_access_key"):
        credentials_from_secret(half, secret_name="s", bucket="models", own=OwnCredentials())
    with_keys = {"models": '{"type": "s3", "access_key_id": "AKIA", "secret_access_key": "s"}'}
    assert credentials_from_secret(with_keys, secret_name="s", bucket="models", own=OwnCredentials()).own is None


_STATUSES = st.sampled_from([200, 200, 400, 403, 404, 429, 500, 502, 503])
_BODIES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"<xml", b"<ErrorResponse/>", b"<AssumeRoleWithWebIdentityResponse/>",
                     sts_error_xml("InvalidIdentityToken", "x" * 5000), sts_error_xml("", ""),
                     granted(issue()).body.replace(b"<SessionToken>", b"<Nope>"),
                     granted(issue()).body.replace(b"2", b"\xff")]),
    st.text(max_size=200).map(lambda t: sts_error_xml(t[:40], t).replace(b"\x00", b"")),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=_STATUSES, body=_BODIES)
async def test_whatever_sts_answers_is_a_storage_error_naming_no_credential(web_identity, sts, status, body):
    sts.reset(lambda call: Answer(status, body, headers=[("Content-Type", "text/xml")]))
    try:
        frozen = await OwnCredentials(deadline=10).frozen()
    except (CredentialsInvalid, StorageUnreachable) as exc:
        assert "service-account.token" not in str(exc) and len(str(exc)) < 800
    else:  # only a well-formed grant gives credentials, and then complete ones
        assert status == 200 and frozen.access_key and frozen.secret_key and frozen.token
