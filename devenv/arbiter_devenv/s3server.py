"""A real S3 server for tests and the local run: MinIO, built from its Go module (hack/tools/minio), on a free
127.0.0.1 port with freshly generated credentials and a throwaway data directory.

    with S3Server() as s3:
        s3.client().put_object(Bucket=..., Key=..., Body=b"...")

With `web_identity=OidcIssuer(...)` its STS also exchanges that OpenID provider's tokens for temporary credentials
(AssumeRoleWithWebIdentity at `endpoint_url`, role `role_arn`, read-write on every bucket): a local control plane's
ServiceAccount tokens, as IRSA and ROSA use them.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
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

__all__ = ["OidcIssuer", "S3Server", "S3ServerError"]


class S3ServerError(RuntimeError):
    pass



@dataclasses.dataclass(frozen=True)
class OidcIssuer:
    """An OpenID provider whose ID tokens the server's STS accepts as web identities."""

    config_url: str  # its discovery document (/.well-known/openid-configuration), fetched at start-up
    audience: str  # the `aud` the tokens must carry (the provider's client id)
    ca_file: pathlib.Path | None = None  # the CA its HTTPS certificate chains to


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

    def start(self) -> S3Server:
        if self._proc is not None:
            return self
        binary = ensure_tool("minio")
        self.workdir = self._given_workdir or pathlib.Path(tempfile.mkdtemp(prefix="arbiter-s3-"))
        if self._given_workdir is None:
            _procs.guard_dir(self.workdir)
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.access_key = "arbiter" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(30)
        _procs.register(self, self.stop)
        try:
            for _attempt in range(3):
                port = free_port()
                self.endpoint_url = f"http://127.0.0.1:{port}"
                env = dict(os.environ)
                env.update(
                    {
                        "MINIO_ROOT_USER": self.access_key,
                        "MINIO_ROOT_PASSWORD": self.secret_key,
                        "MINIO_SITE_REGION": self.region,
                        "MINIO_BROWSER": "off",  # no web console: one port, nothing to bind by accident
                        "MINIO_UPDATE": "off",
                        "MINIO_CALLHOME_ENABLE": "off",
                        # Keep MinIO's own config under the work dir, not ~/.minio.
                        "HOME": str(self.workdir),
                    }
                )
                env.update(self._web_identity_env())
                self._proc = _procs.spawn(
                    [str(binary), "server", "--quiet", "--address", f"127.0.0.1:{port}", str(self.workdir / "data")],
                    log_path=self.workdir / "minio.log",
                    env=env,
                )
                if self._wait_ready(port):
                    return self
                _procs.terminate(self._proc)
                self._proc = None
            raise S3ServerError(f"MinIO did not start; log in {self.workdir / 'minio.log'}")
        except BaseException:
            self.stop()
            raise

    @property
    def role_arn(self) -> str:
        """The role AssumeRoleWithWebIdentity names: MinIO derives it from the client id (a hash, stable)."""
        if self.web_identity is None:
            raise S3ServerError("this S3 server was started without web_identity: it has no role to assume")
        digest = hashlib.sha1(self.web_identity.audience.encode()).digest()  # MinIO's naming, not a security use
        return f"arn:minio:iam:{self.region}::role/{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"

    def _web_identity_env(self) -> dict[str, str]:
        issuer = self.web_identity
        if issuer is None:
            return {}
        assert self.workdir is not None
        if issuer.ca_file is not None:  # MinIO trusts the CAs in its certs directory's CAs/ for outgoing TLS too
            cas = self.workdir / ".minio" / "certs" / "CAs"
            cas.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(issuer.ca_file, cas / "issuer-ca.crt")
        return {"MINIO_IDENTITY_OPENID_CONFIG_URL": issuer.config_url,
                "MINIO_IDENTITY_OPENID_CLIENT_ID": issuer.audience,
                # One role for every token of the issuer; the tokens' own claims pick no policy.
                "MINIO_IDENTITY_OPENID_ROLE_POLICY": "readwrite"}

    def _wait_ready(self, port: int) -> bool:
        assert self.workdir is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self.workdir / "minio.log").read_text(errors="replace")
                if "already in use" in log or "bind:" in log:
                    return False
                raise S3ServerError(
                    f"MinIO exited with code {self._proc.returncode}; last log lines:\n"
                    + "\n".join(log.splitlines()[-20:])
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/minio/health/ready")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return True
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        raise S3ServerError(f"MinIO not ready after {self.start_timeout:.0f}s; log in {self.workdir / 'minio.log'}")

    def stop(self) -> None:
        _procs.terminate(self._proc)
        self._proc = None
        _procs.unregister(self)
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            _procs.forget_dir(self.workdir)
        self.workdir = None

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style addressing, as MinIO on an IP address needs)."""
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
