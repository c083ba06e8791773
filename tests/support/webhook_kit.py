"""The operator's admission webhook on the real apiserver: a CA and a serving certificate for 127.0.0.1 (what the
chart gets from OpenShift's service CA or cert-manager), and a ValidatingWebhookConfiguration as the chart renders it
(failure policy Ignore) but addressed by URL and limited to one namespace, so the shared cluster's other tests never
meet it."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def serving_certificate(directory: Path) -> bytes:
    """tls.crt and tls.key for 127.0.0.1 in `directory`; returns the CA certificate (PEM) that signed them."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("arbiter-test-ca")).issuer_name(_name("arbiter-test-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM)


def webhook_configuration(name: str, port: int, ca: bytes, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "decisionmodels.arbiter.dev",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/decisionmodels",
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": ["arbiter.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["decisionmodels"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "matchPolicy": "Equivalent", "timeoutSeconds": 5,
        }],
    }


def install(api: client.ApiClient, config: dict[str, Any]) -> None:
    client.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(config)


def uninstall(api: client.ApiClient, name: str) -> None:
    client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(name)
