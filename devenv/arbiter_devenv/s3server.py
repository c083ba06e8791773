"""A real S3 server for tests and the local run: SeaweedFS (Apache-2.0), built from its Go module
(hack/tools/seaweedfs), its single-process `weed mini` (master, volume server, filer and S3 gateway) on free
127.0.0.1 ports with freshly generated credentials and a throwaway data directory. docs/devenv.md says why SeaweedFS
and what was checked.

    with S3Server() as s3:
        s3.client().put_object(Bucket=..., Key=..., Body=b"...")

With `web_identity=OidcIssuer(...)` its STS also exchanges that OpenID provider's tokens for temporary credentials
(AssumeRoleWithWebIdentity at `endpoint_url`) for the role `role_arn`, whose trust policy admits the tokens of the
issuer with the given audience and subjects (read-write on every bucket): a local control plane's ServiceAccount
tokens, as IRSA and ROSA use them.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import pathlib
import secrets
import shutil
import tempfile
import time
from typing import Any

from . import _procs
from ._procs import free_port
from .tools import ensure_tool

__all__ = ["DISCOVERY_BINDING", "OidcIssuer", "S3Server", "S3ServerError", "cluster_issuer"]

ROLE_NAME = "web-identity"
ACCOUNT = "000000000000"
PROVIDER = "kubernetes"


class S3ServerError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class OidcIssuer:
    """An OpenID provider whose ID tokens the server's STS accepts as web identities."""

    issuer: str  # the tokens' `iss`
    jwks_url: str  # its signing keys (the discovery document's jwks_uri)
    audience: str  # the `aud` the tokens must carry (the provider's client id)
    subjects: tuple[str, ...]  # the `sub`s the role's trust policy admits
    ca_file: pathlib.Path | None = None  # the CA its HTTPS certificate chains to


DISCOVERY_BINDING = "arbiter-devenv-service-account-issuer-discovery"


def cluster_issuer(cluster: Any, audience: str, subjects: tuple[str, ...]) -> OidcIssuer:
    """A local cluster's ServiceAccount issuer as an OpenID provider for `S3Server(web_identity=...)`: its discovery
    document and keys made readable without credentials (system:service-account-issuer-discovery bound to
    system:unauthenticated, as a cluster whose issuer AWS trusts does; named DISCOVERY_BINDING), read once over HTTPS
    to find the issuer's name and its keys' address on loopback (the control plane's --service-account-jwks-uri)."""
    import ssl
    import urllib.error
    import urllib.request

    from kubernetes import client as k8s

    api = cluster.api_client()
    try:
        try:
            k8s.RbacAuthorizationV1Api(api).create_cluster_role_binding({
                "metadata": {"name": DISCOVERY_BINDING},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:service-account-issuer-discovery"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                              "name": "system:unauthenticated"}]})
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    finally:
        api.close()
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    # The apiserver's RBAC authorizer reads bindings from its informer: a binding just made may not count for a
    # moment (403 to an anonymous GET on a busy machine), so the read is retried for a while.
    deadline = time.monotonic() + 30
    while True:
        try:
            url = f"{cluster.server}/.well-known/openid-configuration"
            with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
                doc = json.load(r)  # anonymously, as an identity provider reads it
            break
        except urllib.error.HTTPError as exc:
            if exc.code != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return OidcIssuer(issuer=doc["issuer"], jwks_url=doc["jwks_uri"], audience=audience, subjects=subjects,
                      ca_file=pathlib.Path(cluster.ca_file))


# What `weed mini` would otherwise start or call: the WebDAV gateway, the admin UI, the Iceberg and Lance catalogs,
# the telemetry report.
_OFF = ("-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false")
# Its capacity, fixed rather than derived from the host: left to itself `weed mini` allows free disk / volume size
# volumes (1 GiB each), and every bucket takes a volume of its own: at 5 volumes (a host with 5 GiB free) the sixth
# bucket's first PutObject answered InternalError, which the suite read as a fault of the code under test. Volumes
# are not preallocated: the count costs no disk until written.
_CAPACITY = ("-volume.max=1000", "-master.volumeSizeLimitMB=64")
# Every listener `weed mini` opens, each given a free port (its defaults are fixed ports, and the gRPC ones follow
# from the HTTP ones: two servers on one machine would collide).
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "s3.port.grpc")


class S3Server:
    region = "us-east-1"

    def __init__(self, *, workdir: os.PathLike[str] | str | None = None, start_timeout: float = 60.0,
                 web_identity: OidcIssuer | None = None) -> None:
        self.web_identity = web_identity
        self._given_workdir = pathlib.Path(workdir) if workdir else None
        self.start_timeout = start_timeout
        self.workdir: pathlib.Path | None = None
        self.endpoint_url = ""
        self.access_key = ""
        self.secret_key = ""
        self._proc: Any = None

    def __repr__(self) -> str:  # never the secret key
        return f"S3Server(endpoint_url={self.endpoint_url!r}, access_key={self.access_key!r})"

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def role_arn(self) -> str:
        """The role AssumeRoleWithWebIdentity names."""
        if self.web_identity is None:
            raise S3ServerError("this S3 server was started without web_identity: it has no role to assume")
        return f"arn:aws:iam::{ACCOUNT}:role/{ROLE_NAME}"

    def start(self) -> S3Server:
        if self._proc is not None:
            return self
        binary = ensure_tool("seaweedfs")
        self.workdir = self._given_workdir or pathlib.Path(tempfile.mkdtemp(prefix="arbiter-s3-"))
        if self._given_workdir is None:
            _procs.guard_dir(self.workdir)
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.access_key = "arbiter" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(30)
        config = self._write_config()
        _procs.register(self, self.stop)
        try:
            for _attempt in range(3):
                ports = {name: free_port() for name in _PORTS}
                self.endpoint_url = f"http://127.0.0.1:{ports['s3.port']}"
                env = dict(os.environ)
                # Its configuration files (security.toml, filer.toml) are looked for in ., ~/.seaweedfs and /etc:
                # only the work dir's, which holds none.
                env["HOME"] = str(self.workdir)
                argv = [str(binary), "mini", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                        *(f"-{name}={port}" for name, port in ports.items()), *_OFF, *_CAPACITY,
                        f"-s3.config={config}", "-s3.allowDeleteBucketNotEmpty=true", "-s3.autoCreateBucket=false"]
                if self.web_identity is not None:
                    argv.append(f"-s3.iam.config={config}")
                self._proc = _procs.spawn(argv, log_path=self.workdir / "seaweedfs.log", env=env, cwd=self.workdir)
                if self._wait_ready(ports["s3.port"]):
                    return self
                _procs.terminate(self._proc)
                self._proc = None
            raise S3ServerError(f"SeaweedFS did not start; log in {self.workdir / 'seaweedfs.log'}")
        except BaseException:
            self.stop()
            raise

    def _write_config(self) -> pathlib.Path:
        """The S3 gateway's identities (one admin, these keys) and, with a web identity, its STS, the OpenID
        provider, one role and its policy."""
        assert self.workdir is not None
        doc: dict[str, Any] = {"identities": [{
            "name": "arbiter-admin", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
        issuer = self.web_identity
        if issuer is not None:
            provider: dict[str, Any] = {"issuer": issuer.issuer, "clientId": issuer.audience,
                                        "jwksUri": issuer.jwks_url}
            if issuer.ca_file is not None:
                provider["tlsCaCert"] = str(pathlib.Path(issuer.ca_file).resolve())
            doc.update({
                "sts": {"tokenDuration": "1h", "maxSessionLength": "12h", "issuer": "arbiter-test-sts",
                        "signingKey": base64.b64encode(secrets.token_bytes(32)).decode()},
                "policy": {"defaultEffect": "Deny", "storeType": "memory"},
                "providers": [{"name": PROVIDER, "type": "oidc", "enabled": True, "config": provider}],
                "policies": [{"name": "read-write", "document": {"Version": "2012-10-17", "Statement": [
                    {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]}]}}],
                "roles": [{"roleName": ROLE_NAME, "roleArn": self.role_arn, "attachedPolicies": ["read-write"],
                           "trustPolicy": {"Version": "2012-10-17", "Statement": [{
                               "Effect": "Allow", "Principal": {"Federated": PROVIDER},
                               "Action": ["sts:AssumeRoleWithWebIdentity"],
                               "Condition": {"StringEquals": {"oidc:sub": list(issuer.subjects)}}}]}}],
            })
        path = self.workdir / "s3.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
        return path

    def _wait_ready(self, port: int) -> bool:
        """Up when the gateway answers a signed ListBuckets (its filer and volume server behind it are up too)."""
        assert self.workdir is not None
        deadline = time.monotonic() + self.start_timeout
        log = self.workdir / "seaweedfs.log"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                text = log.read_text(errors="replace")
                if "address already in use" in text or "bind:" in text:
                    return False
                raise S3ServerError(f"SeaweedFS exited with code {self._proc.returncode}; last log lines:\n"
                                    + "\n".join(text.splitlines()[-20:]))
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
                conn.close()
                if status == 200 and self._answers():
                    return True
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        raise S3ServerError(f"SeaweedFS not ready after {self.start_timeout:.0f}s; log in {log}")

    def _answers(self) -> bool:
        import botocore.exceptions

        try:
            self.client().list_buckets()
            return True
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False

    def stop(self) -> None:
        _procs.terminate(self._proc)
        self._proc = None
        _procs.unregister(self)
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            _procs.forget_dir(self.workdir)
        self.workdir = None

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style addressing, as a server on an IP address needs)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )
