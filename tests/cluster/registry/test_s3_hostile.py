"""The artifact check's S3 reads against a hostile S3 endpoint (support.hostile_s3): whatever the server sends, the
check ends in a report (never an exception), reads no more than its bounds, follows no redirect, and never shows the
secret key.

The property test draws the server's answer (valid listings with odd keys, bytes that are not XML, XML cut short, a
DTD, entity declarations, wrong roots, error documents with any status and code, lying lengths, chunked framing
right and wrong, huge bodies) and drives `check_version_artifacts` and `S3Storage` as the reconcile does. The
examples below it pin down the cases a user would see: an entity bomb, a gigabyte listing, a server that ignores
Range, a compressed body, a stall, a trickle, a redirect to another host, a wrong region, retries, paging,
connection reuse, TLS trust.
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ssl
import time
from urllib.parse import quote

import pytest
from arbiter_operator.clients.s3 import (
    MAX_PAGE_BYTES,
    S3Credentials,
    S3Storage,
    StorageRejected,
    StorageUnreachable,
)
from arbiter_operator.observe.storage import check_version_artifacts
from arbiter_operator.plan.artifacts import ServingAsk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile_s3 import Answer, HostileS3, S3Request, chunked, error_xml, listing_xml

SECRET = "hostile-s3-secret-" + "k" * 24
PREFIX = "m"
BOMB = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
<!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">]>
<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&lol9;</Key><Size>1</Size></Contents>
</ListBucketResult>"""
EXTERNAL = b"""<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<ListBucketResult><Contents><Key>&x;</Key><Size>1</Size></Contents></ListBucketResult>"""


@pytest.fixture(scope="module")
def peer():
    server = HostileS3().start()
    yield server
    server.stop()


def storage(endpoint: str, *, connect: float = 1.0, read: float = 1.0, **creds) -> S3Storage:
    fields = {"access_key_id": "AKIAHOSTILE", "secret_access_key": SECRET, "endpoint_url": endpoint,
              "region": "us-east-1", **creds}
    return S3Storage(S3Credentials(**fields), connect_timeout=connect, read_timeout=read)


async def outcome(coro):
    """The value, or the storage error raised; anything else propagates and fails the test."""
    try:
        return await coro
    except (StorageRejected, StorageUnreachable) as exc:
        return exc


def run_on(peer: HostileS3, answer, coro_fn, **kw):
    """Reset the peer to `answer` (an Answer for every request, or a function of the request) and run one storage
    call in a fresh event loop, as a reconcile does."""
    peer.reset(answer if callable(answer) else (lambda request: answer))

    async def go():
        async with storage(peer.endpoint_url, **kw) as s3:
            return await outcome(coro_fn(s3))
    return asyncio.run(go())


# ---- the property: whatever the server answers ------------------------------------------------------------------

def keys(xml_safe: bool):  # type: ignore[no-untyped-def]
    """Object keys: any text when the listing is URL-encoded (what encoding-type=url is for), else what XML can hold."""
    banned = ("Cs", "Cc") if xml_safe else ("Cs",)
    return st.lists(st.tuples(st.text(st.characters(blacklist_categories=banned), min_size=1, max_size=40),
                              st.integers(0, 1 << 40)), max_size=12)


@st.composite
def answers(draw) -> tuple[str, Answer]:
    """(what a correct client must make of it, the answer)."""
    kind = draw(st.sampled_from(["listing", "bytes", "cut", "declared", "root", "error", "lying", "huge", "type",
                                 "chunked", "bad-chunks"]))
    if kind == "listing":
        url_encoded = draw(st.booleans())
        listed = [(f"{PREFIX}/{k}", size) for k, size in draw(keys(xml_safe=not url_encoded))]
        return "listing", Answer(200, listing_xml(listed, prefix=PREFIX + "/", url_encoded=url_encoded))
    if kind == "bytes":
        return "malformed", Answer(200, draw(st.binary(max_size=2000)))
    if kind == "cut":
        body = listing_xml([(f"{PREFIX}/config.json", 3)])
        return "malformed", Answer(200, body[:draw(st.integers(0, len(body) - 2))])
    if kind == "declared":
        return "malformed", Answer(200, draw(st.sampled_from([BOMB, EXTERNAL])))
    if kind == "root":
        name = draw(st.sampled_from(["Error", "ListAllMyBucketsResult", "html", "ListBucketResultX"]))
        return "malformed", Answer(200, f"<{name}><IsTruncated>false</IsTruncated></{name}>".encode())
    if kind == "error":
        status = draw(st.sampled_from([301, 302, 307, 400, 403, 404, 409, 416, 429, 500, 502, 503]))
        code = draw(st.one_of(st.sampled_from(["AccessDenied", "NoSuchBucket", "SlowDown", "InternalError"]),
                              st.text(max_size=80)))
        body = draw(st.one_of(st.just(error_xml(quote(code))), st.binary(max_size=300)))
        extra = [("Location", "http://127.0.0.2:9/elsewhere")] if status in (301, 302, 307) else []
        return "error", Answer(status, body, headers=[("Content-Type", "application/xml"), *extra])
    if kind == "lying":
        body = listing_xml([(f"{PREFIX}/config.json", 3)])
        return "unreachable", Answer(200, body[:draw(st.integers(0, len(body) - 1))],
                                     content_length=len(body) + draw(st.integers(1, 5000)), close=True)
    if kind == "chunked":
        body = listing_xml([(f"{PREFIX}/config.json", 3)])
        return "listing", Answer(200, chunked(body, draw(st.integers(1, 500))), chunked=True)
    if kind == "bad-chunks":
        body = listing_xml([(f"{PREFIX}/config.json", 3)])
        framing = draw(st.sampled_from([b"FFFFFFFFFFFF\r\n", b"zz\r\n", b"-5\r\n", b"10\r\n"]))
        return "unreachable", Answer(200, framing + body[:draw(st.integers(0, 10))], chunked=True, close=True)
    if kind == "huge":
        return "malformed", Answer(200, b"<" * 65536, repeat=MAX_PAGE_BYTES // 65536 + draw(st.integers(1, 8)))
    body = listing_xml([(f"{PREFIX}/config.json", 3)])
    content_type = draw(st.sampled_from(["text/html", "application/json", "", "application/octet-stream"]))
    return "listing", Answer(200, body, headers=[("Content-Type", content_type)] if content_type else [])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=answers(), max_bytes=st.integers(1, 5000))
def test_whatever_s3_answers_the_check_reports_and_reads_stay_bounded(peer, case, max_bytes):
    expect, answer = case
    listed = run_on(peer, answer, lambda s3: s3.list_objects("models", PREFIX))
    if expect == "listing":
        assert not isinstance(listed, Exception), listed
        want = {k[len(PREFIX) + 1:] for k, _ in _keys_of(answer)}
        assert {o.key for o in listed} == want
    elif expect in ("malformed", "unreachable"):
        assert isinstance(listed, StorageUnreachable), listed
        if expect == "malformed":
            assert "not S3's answer" in str(listed) and len(peer.requests) == 1  # not retried: it would not help
    else:
        assert isinstance(listed, (StorageRejected, StorageUnreachable)), listed
        if answer.status >= 500:
            assert isinstance(listed, StorageUnreachable) and len(peer.requests) == 2  # retried once
    assert all(r.query.get("list-type") == "2" and r.query.get("prefix") == PREFIX + "/" for r in peer.requests)

    got = run_on(peer, answer, lambda s3: s3.get_bytes("models", f"{PREFIX}/config.json", max_bytes))
    assert got is None or isinstance(got, (bytes, StorageRejected, StorageUnreachable)), got
    if isinstance(got, bytes):
        sent = _payload(answer)
        assert len(got) <= max_bytes and sent.startswith(got[:len(sent)])
    assert all(r.headers.get("range") == f"bytes=0-{max_bytes - 1}" for r in peer.requests)

    report = run_on(peer, answer, lambda s3: check_version_artifacts(s3, f"s3://models/{PREFIX}", ServingAsk()))
    assert report.status in ("True", "False", "Unknown") and report.reason and report.message
    assert SECRET not in report.message and SECRET not in repr(report)
    for request in peer.requests:
        assert SECRET not in str(request.headers)
        assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAHOSTILE/")


def _payload(answer: Answer) -> bytes:
    """The body as the client should see it: without the chunked framing, when the framing is valid."""
    if not answer.chunked:
        return answer.body
    out, rest = b"", answer.body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        try:
            size = int(size_line, 16)
        except ValueError:
            return out
        out, rest = out + rest[:size], rest[size + 2:]
        if size == 0:
            break
    return out


def _keys_of(answer: Answer) -> list[tuple[str, int]]:
    """The keys a valid listing answer holds, parsed back with the stdlib (the peer's own document)."""
    import xml.etree.ElementTree as ET
    from urllib.parse import unquote

    root = ET.fromstring(_payload(answer))
    ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
    encoded = root.findtext("s3:EncodingType", namespaces=ns) == "url"
    out = []
    for c in root.findall("s3:Contents", ns):
        key = c.findtext("s3:Key", namespaces=ns) or ""
        out.append((unquote(key) if encoded else key, int(c.findtext("s3:Size", namespaces=ns) or 0)))
    return out


# ---- the cases a user would see ---------------------------------------------------------------------------------

def test_an_entity_bomb_is_refused_before_it_expands(peer):
    started = time.monotonic()
    listed = run_on(peer, Answer(200, BOMB), lambda s3: s3.list_objects("models", PREFIX))
    assert isinstance(listed, StorageUnreachable)
    assert "declares a DTD" in str(listed) or "declares entities" in str(listed), str(listed)
    assert time.monotonic() - started < 5


def test_a_gigabyte_listing_is_not_read_past_its_bound(peer):
    started = time.monotonic()
    listed = run_on(peer, Answer(200, b"<" * 65536, repeat=16384), lambda s3: s3.list_objects("models", PREFIX))
    assert isinstance(listed, StorageUnreachable) and "over 4 MiB" in str(listed)
    assert peer.bytes_sent < 64 * 1024 * 1024, peer.bytes_sent  # of 1 GiB offered; the rest is socket buffers
    assert time.monotonic() - started < 20


def test_a_server_that_ignores_the_range_is_cut_at_the_bound(peer):
    body = bytes(range(256)) * 40960  # 10 MiB, sent whole with 200 instead of 206
    got = run_on(peer, Answer(200, body), lambda s3: s3.get_bytes("models", "m/tokenizer.json", 1000))
    assert got == body[:1000]
    assert peer.requests[0].headers["range"] == "bytes=0-999"
    assert peer.bytes_sent < 64 * 1024 * 1024


def test_a_compressed_body_is_never_expanded(peer):
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))
    answer = Answer(200, bomb, headers=[("Content-Encoding", "gzip"), ("Content-Type", "application/json")])
    got = run_on(peer, answer, lambda s3: s3.get_bytes("models", "m/config.json", 4096))
    assert got == bomb[:4096]
    assert peer.requests[0].headers["accept-encoding"] == "identity"


def test_a_stalled_answer_is_unreachable_after_the_read_timeout(peer):
    started = time.monotonic()
    listed = run_on(peer, Answer(200, listing_xml([]), stall=5), lambda s3: s3.list_objects("models", PREFIX),
                    read=0.5)
    assert isinstance(listed, StorageUnreachable) and "no data within the read timeout" in str(listed), str(listed)
    assert len(peer.requests) == 2 and time.monotonic() - started < 4


def test_a_trickling_answer_is_cut_at_the_request_deadline(peer):
    body = listing_xml([(f"{PREFIX}/config.json", 3)] * 20)  # 16 bytes every 0.2 s: minutes in all
    started = time.monotonic()
    listed = run_on(peer, Answer(200, body, trickle=0.2), lambda s3: s3.list_objects("models", PREFIX),
                    connect=0.5, read=0.5)
    assert isinstance(listed, StorageUnreachable) and "no complete answer within 1.5 s" in str(listed), str(listed)
    assert time.monotonic() - started < 6


def test_a_redirect_is_never_followed(peer):
    elsewhere = HostileS3().start()
    try:
        elsewhere.reset(lambda request: Answer(200, listing_xml([])))
        answer = Answer(307, error_xml("TemporaryRedirect"),
                        headers=[("Location", f"{elsewhere.endpoint_url}/models?list-type=2")])
        listed = run_on(peer, answer, lambda s3: s3.list_objects("models", PREFIX))
        assert isinstance(listed, StorageRejected) and listed.code == "TemporaryRedirect"
        assert elsewhere.requests == [] and len(peer.requests) == 1
    finally:
        elsewhere.stop()


def test_a_wrong_region_is_corrected_once_from_s3s_answer(peer):
    def answer(request: S3Request) -> Answer:
        if "/eu-west-1/s3/aws4_request" in request.headers["authorization"]:
            return Answer(200, listing_xml([(f"{PREFIX}/config.json", 3)]))
        return Answer(301, error_xml("PermanentRedirect"),
                      headers=[("Content-Type", "application/xml"), ("x-amz-bucket-region", "eu-west-1")])

    listed = run_on(peer, answer, lambda s3: s3.list_objects("models", PREFIX))
    assert [o.key for o in listed] == ["config.json"] and len(peer.requests) == 2

    stubborn = Answer(301, error_xml("PermanentRedirect"),
                      headers=[("Content-Type", "application/xml"), ("x-amz-bucket-region", "eu-west-1")])
    listed = run_on(peer, stubborn, lambda s3: s3.list_objects("models", PREFIX))
    assert isinstance(listed, StorageRejected) and listed.code == "PermanentRedirect" and len(peer.requests) == 2


def test_throttling_is_retried_once(peer):
    answers = iter([Answer(503, error_xml("SlowDown")), Answer(200, listing_xml([(f"{PREFIX}/a", 1)]))])
    listed = run_on(peer, lambda request: next(answers), lambda s3: s3.list_objects("models", PREFIX))
    assert [o.key for o in listed] == ["a"]
    listed = run_on(peer, Answer(503, error_xml("SlowDown")), lambda s3: s3.list_objects("models", PREFIX))
    assert isinstance(listed, StorageUnreachable) and "SlowDown" in str(listed) and len(peer.requests) == 2


def test_pages_are_followed_and_a_listing_that_does_not_end_is_refused(peer):
    def paged(request: S3Request) -> Answer:
        page = int(request.query.get("continuation-token", "t0")[1:])
        last = page == 2
        return Answer(200, listing_xml([(f"{PREFIX}/f{page}", 1)], truncated=not last,
                                       token=None if last else f"t{page + 1}"))

    listed = run_on(peer, paged, lambda s3: s3.list_objects("models", PREFIX))
    assert [o.key for o in listed] == ["f0", "f1", "f2"]
    assert [r.query.get("continuation-token") for r in peer.requests] == [None, "t1", "t2"]

    endless = Answer(200, listing_xml([(f"{PREFIX}/again", 1)], truncated=True, token="same"))
    listed = run_on(peer, endless, lambda s3: s3.list_objects("models", PREFIX))
    assert isinstance(listed, StorageUnreachable) and "does not end" in str(listed) and len(peer.requests) == 2

    limited = run_on(peer, paged, lambda s3: s3.list_objects("models", PREFIX, limit=2))
    assert [o.key for o in limited] == ["f0", "f1"] and len(peer.requests) == 2


def test_keys_outside_the_prefix_are_not_counted(peer):
    answer = Answer(200, listing_xml([(f"{PREFIX}/config.json", 3), ("other/model.safetensors", 9),
                                      (f"{PREFIX}x/y", 1)]))
    listed = run_on(peer, answer, lambda s3: s3.list_objects("models", PREFIX))
    assert [o.key for o in listed] == ["config.json"]


def test_missing_and_empty_objects(peer):
    assert run_on(peer, Answer(404, error_xml("NoSuchKey")), lambda s3: s3.get_bytes("models", "m/a")) is None
    assert run_on(peer, Answer(416, error_xml("InvalidRange")), lambda s3: s3.get_bytes("models", "m/a")) == b""
    gone = run_on(peer, Answer(404, error_xml("NoSuchBucket")), lambda s3: s3.get_bytes("models", "m/a"))
    assert isinstance(gone, StorageRejected) and gone.code == "NoSuchBucket"


def test_the_reads_of_a_check_share_one_connection(peer):
    def answer(request: S3Request) -> Answer:
        if "list-type" in request.query:
            return Answer(200, listing_xml([(f"{PREFIX}/config.json", 2), (f"{PREFIX}/model.safetensors", 1),
                                            (f"{PREFIX}/model.safetensors.index.json", 2)]))
        return Answer(200, b"{}", headers=[("Content-Type", "application/json")])

    async def two_checks(s3):
        first = await check_version_artifacts(s3, f"s3://models/{PREFIX}", ServingAsk())
        second = await check_version_artifacts(s3, f"s3://models/{PREFIX}", ServingAsk())
        return first, second

    first, second = run_on(peer, answer, two_checks)
    assert first == second and len(peer.requests) == 6
    assert peer.connections == 1


def test_keys_are_addressed_and_signed_as_sent(peer):
    key = "m/odd key+/ü/../%2F?x=1#frag"
    run_on(peer, Answer(200, b"x"), lambda s3: s3.get_bytes("models", key, 10))
    (request,) = peer.requests
    assert request.path == "/models/" + "/".join({"..": "%2E%2E"}.get(s, quote(s, safe="")) for s in key.split("/"))
    signed = request.headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert {"host", "range", "x-amz-content-sha256", "x-amz-date"} <= set(signed)


def test_anonymous_reads_carry_no_signature(peer):
    run_on(peer, Answer(200, listing_xml([])), lambda s3: s3.list_objects("models", PREFIX),
           anonymous=True, access_key_id="", secret_access_key="")
    assert "authorization" not in peer.requests[0].headers


# ---- TLS: the trust the storage config asks for ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_peer(tmp_path_factory):
    """The hostile peer behind TLS with a certificate for 127.0.0.1 from a throwaway CA."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    where = tmp_path_factory.mktemp("tls")
    (where / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(where / "cert.pem", where / "key.pem")
    server = HostileS3()
    server.ssl_context = context
    server.start()
    server.reset(lambda request: Answer(200, listing_xml([(f"{PREFIX}/config.json", 3)])))
    yield server, ca.public_bytes(serialization.Encoding.PEM).decode()
    server.stop()


def test_tls_is_verified_against_the_configured_ca_bundle(tls_peer):
    server, ca_pem = tls_peer
    endpoint = f"https://127.0.0.1:{server.port}"

    async def listing(**creds):
        async with storage(endpoint, **creds) as s3:
            return await outcome(s3.list_objects("models", PREFIX))

    trusted = asyncio.run(listing(ca_bundle_pem=ca_pem))
    assert [o.key for o in trusted] == ["config.json"]
    untrusted = asyncio.run(listing())
    assert isinstance(untrusted, StorageUnreachable) and "TLS certificate is not trusted" in str(untrusted)
    unverified = asyncio.run(listing(verify_ssl=False))
    assert [o.key for o in unverified] == ["config.json"]
    broken = asyncio.run(listing(ca_bundle_pem="-----BEGIN CERTIFICATE-----\nnot a certificate\n"))
    assert isinstance(broken, StorageUnreachable) and "CA bundle" in str(broken)
