"""TLS to the registry: verified by default, a CA bundle makes a private CA work, and an unknown CA is an outage
(Unknown), never silently accepted.

OpenShift AI puts kube-rbac-proxy (TLS, service-CA signed) in front of the registry; here a small TLS-terminating
relay in front of the real registry plays that role with a CA the test makes.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import uuid

import pytest
from arbiter_operator.clients.registry import RegistryClient
from arbiter_operator.reconcile import utc_now
from arbiter_operator.sync.registry import sync_registry
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.factory import make_dm

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _cert(subject: str, issuer_key, issuer_name, key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("arbiter-test-ca", ca_key, None, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("registry", ca_key, ca.subject, key, ca=False)
    d = tmp_path_factory.mktemp("pki")
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return {"ca_pem": ca.public_bytes(serialization.Encoding.PEM).decode(), "cert": d / "tls.crt", "key": d / "tls.key"}


@pytest.fixture
async def tls_registry(model_registry, pki):
    """https://127.0.0.1:PORT relaying to the real registry."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki["cert"], pki["key"])
    upstream_port = int(model_registry.url.rsplit(":", 1)[1])

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    yield f"https://127.0.0.1:{port}"
    server.close()


async def test_ca_bundle_makes_a_private_ca_work(tls_registry, pki):
    async with RegistryClient(tls_registry, ca_bundle_pem=pki["ca_pem"]) as client:
        result = await sync_registry(client, make_dm(model=f"tls-{uuid.uuid4().hex[:6]}", versions=["1.0.0"]),
            now=utc_now())
    assert result.ok, result.condition.message


async def test_unknown_ca_is_refused_and_reported_as_unreachable(tls_registry):
    async with RegistryClient(tls_registry) as client:  # system roots only
        result = await sync_registry(client, make_dm(model=f"tls-{uuid.uuid4().hex[:6]}", versions=["1.0.0"]),
            now=utc_now())
    assert (result.condition.status, result.condition.reason) == ("Unknown", "RegistryUnreachable")
    assert "CERTIFICATE_VERIFY_FAILED" in result.condition.message or "certificate" in result.condition.message.lower()
    assert result.versions == {}

