"""A throwaway Kubernetes control plane (etcd + kube-apiserver) on 127.0.0.1, the way controller-runtime's envtest
starts one: random free ports, a fresh CA and serving certificate, a service-account signing key, RBAC, and an admin
client certificate in ``system:masters``. There is no controller-manager, scheduler or kubelet: objects are stored
and validated, admission (Pod Security included) runs, but nothing reconciles them (namespaces being deleted stay
Terminating; ServiceAccounts named ``default`` are not created for new namespaces).

    with ControlPlane() as cp:
        api = cp.api_client()

``python -m arbiter_devenv.controlplane`` starts one and prints its kubeconfig path until Ctrl-C.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import pathlib
import shutil
import ssl
import sys
import tempfile
import time
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from . import _procs
from ._procs import free_port
from .tools import ensure_tool

__all__ = ["ControlPlane", "ControlPlaneError", "ExistingCluster"]

SERVICE_CIDR = "10.0.0.0/16"  # room for a predictor Service per InferenceService at scale (a /24 fills at ~250)
SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the in-cluster "kubernetes" Service
ISSUER = "https://kubernetes.default.svc.cluster.local"

# What a current cluster enables by default, listed so the choice is visible and stable across versions. PodSecurity
# enforces the pod-security.kubernetes.io/* namespace labels; ServiceAccount needs the "default" ServiceAccount to
# exist before a pod can be created (the namespace fixture creates it, since no controller-manager runs).
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "DefaultTolerationSeconds",
    "PodSecurity",
    "Priority",
    "RuntimeClass",
    "DefaultIngressClass",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
)


class ControlPlaneError(RuntimeError):
    pass



def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _CA:
    """A one-day CA; the control plane lives for one test session."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "arbiter-devenv-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, builder.sign(self.key, hashes.SHA256())


class ControlPlane:
    """etcd + kube-apiserver on random 127.0.0.1 ports; see the module docstring."""

    def __init__(
        self,
        *,
        workdir: os.PathLike[str] | str | None = None,
        extra_apiserver_args: tuple[str, ...] = (),
        start_timeout: float = 120.0,
    ) -> None:
        self._given_workdir = pathlib.Path(workdir) if workdir else None
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.start_timeout = start_timeout
        self.workdir: pathlib.Path | None = None
        self.server = ""
        self.kubeconfig: pathlib.Path | None = None
        self.ca_file: pathlib.Path | None = None
        self.client_cert_file: pathlib.Path | None = None
        self.client_key_file: pathlib.Path | None = None
        self._etcd: Any = None
        self._apiserver: Any = None
        self._ca: _CA | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of etcd and kube-apiserver (each leads its own process group)."""
        out = {}
        if self._etcd is not None:
            out["etcd"] = self._etcd.pid
        if self._apiserver is not None:
            out["kube-apiserver"] = self._apiserver.pid
        return out

    def start(self) -> ControlPlane:
        if self._apiserver is not None:
            return self
        etcd_bin = ensure_tool("etcd")
        apiserver_bin = ensure_tool("kube-apiserver")
        self.workdir = self._given_workdir or pathlib.Path(tempfile.mkdtemp(prefix="arbiter-controlplane-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._given_workdir is None:
            _procs.guard_dir(self.workdir)
        _procs.register(self, self.stop)
        try:
            self._write_credentials()
            # A port picked free can be taken before the server binds it; a fresh set of ports usually fixes it.
            last: Exception | None = None
            for _attempt in range(3):
                try:
                    self._start_once(etcd_bin, apiserver_bin)
                    return self
                except _PortRace as exc:
                    last = exc
                    self._stop_processes()
            raise ControlPlaneError(f"could not start the control plane: {last}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd, and remove the work directory (unless it was given)."""
        self._stop_processes()
        _procs.unregister(self)
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            _procs.forget_dir(self.workdir)
        self.workdir = None

    def _stop_processes(self) -> None:
        _procs.terminate(self._apiserver)
        self._apiserver = None
        _procs.terminate(self._etcd)
        self._etcd = None

    # -- clients ---------------------------------------------------------------------------------------------

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient with cluster-admin rights (client certificate in system:masters)."""
        from kubernetes import config

        if self.kubeconfig is None:
            raise ControlPlaneError("the control plane is not running")
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def write_kubeconfig(self, path: os.PathLike[str] | str, *, token: str | None = None, namespace: str = "default",
                         user: str = "admin") -> pathlib.Path:
        """Write a self-contained kubeconfig: admin client certificate, or ``token`` (e.g. a ServiceAccount's)."""
        assert self.ca_file is not None and self.client_cert_file and self.client_key_file
        b64 = lambda p: base64.b64encode(pathlib.Path(p).read_bytes()).decode()  # noqa: E731
        if token is not None:
            user_entry: dict[str, str] = {"token": token}
        else:
            user_entry = {
                "client-certificate-data": b64(self.client_cert_file),
                "client-key-data": b64(self.client_key_file),
            }
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "arbiter-devenv", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.ca_file)}}],
            "users": [{"name": user, "user": user_entry}],
            "contexts": [{"name": "arbiter-devenv", "context": {
                "cluster": "arbiter-devenv", "user": user, "namespace": namespace}}],
            "current-context": "arbiter-devenv",
        }
        path = pathlib.Path(path)
        # Holds a private key or a token: owner-only from the first byte.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=2)  # JSON is YAML; every kubeconfig reader accepts it
        return path

    def write_client_kubeconfig(self, path: os.PathLike[str] | str, user: str,
                                groups: tuple[str, ...] = ("system:masters",)) -> pathlib.Path:
        """A kubeconfig with a client certificate of its own for ``user`` (so audit logs tell the components apart)."""
        if self._ca is None or self.ca_file is None:
            raise ControlPlaneError("the control plane is not running")
        key, cert = self._ca.issue(user, organizations=groups)
        b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "arbiter-devenv", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.ca_file.read_bytes())}}],
            "users": [{"name": user, "user": {"client-certificate-data": b64(_pem_cert(cert)),
                                              "client-key-data": b64(_pem_key(key))}}],
            "contexts": [{"name": "arbiter-devenv", "context": {"cluster": "arbiter-devenv", "user": user}}],
            "current-context": "arbiter-devenv",
        }
        path = pathlib.Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=2)
        return path

    def issue_serving_certificate(self, directory: os.PathLike[str] | str,
                                  name: str = "tls") -> tuple[pathlib.Path, pathlib.Path]:
        """A serving certificate for 127.0.0.1/localhost from this control plane's CA (webhook servers), written as
        ``<name>.crt`` and ``<name>.key`` into ``directory``; the CA is ``self.ca_file``."""
        if self._ca is None:
            raise ControlPlaneError("the control plane is not running")
        key, cert = self._ca.issue(name, dns=("localhost",), ips=("127.0.0.1",), server=True)
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        crt, key_path = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(_pem_cert(cert))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_pem_key(key))
        return crt, key_path

    # -- internals -------------------------------------------------------------------------------------------

    def _write_credentials(self) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        pki.mkdir(mode=0o700, exist_ok=True)
        ca = self._ca = _CA()
        serving_key, serving_cert = ca.issue(
            "kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            ips=("127.0.0.1", SERVICE_IP),
            server=True,
        )
        admin_key, admin_cert = ca.issue("arbiter-admin", organizations=("system:masters",))
        sa_key = ec.generate_private_key(ec.SECP256R1())

        def write(name: str, data: bytes, mode: int = 0o600) -> pathlib.Path:
            p = pki / name
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return p

        self.ca_file = write("ca.crt", _pem_cert(ca.cert), 0o644)
        write("apiserver.crt", _pem_cert(serving_cert), 0o644)
        write("apiserver.key", _pem_key(serving_key))
        self.client_cert_file = write("admin.crt", _pem_cert(admin_cert), 0o644)
        self.client_key_file = write("admin.key", _pem_key(admin_key))
        write("sa.key", _pem_key(sa_key))
        write("sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)

    def _start_once(self, etcd_bin: pathlib.Path, apiserver_bin: pathlib.Path) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        data_dir = self.workdir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        self._etcd = _procs.spawn(
            [
                str(etcd_bin),
                "--name=default",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                # Throwaway data: durability buys nothing and fsync is most of etcd's latency on a shared disk.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            log_path=self.workdir / "etcd.log",
        )
        self.server = f"https://127.0.0.1:{api_port}"
        self._apiserver = _procs.spawn(
            [
                str(apiserver_bin),
                f"--etcd-servers={etcd_url}",
                "--advertise-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-issuer={ISSUER}",
                # The issuer's discovery document points at its keys on loopback, where a local S3 server's STS can
                # fetch them (the issuer's own name resolves nowhere here): ServiceAccount tokens as web identities.
                f"--service-account-jwks-uri={self.server}/openid/v1/jwks",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--api-audiences={ISSUER}",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                "--allow-privileged=true",
                # The "kubernetes" Service's Endpoints cannot hold a loopback address (validation refuses it, every
                # 10 s, in the log); nothing in-cluster routes to it here anyway.
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki}",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
            log_path=self.workdir / "kube-apiserver.log",
        )
        self.kubeconfig = self.write_kubeconfig(self.workdir / "kubeconfig")
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.ca_file and self.client_cert_file and self.client_key_file and self.workdir
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        port = int(self.server.rsplit(":", 1)[1])
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver)):
                if proc.poll() is not None:
                    log = (self.workdir / f"{name}.log").read_text(errors="replace")
                    if "address already in use" in log:
                        raise _PortRace(f"{name}: address already in use")
                    raise ControlPlaneError(
                        f"{name} exited with code {proc.returncode} during start-up; last log lines:\n"
                        + "\n".join(log.splitlines()[-30:])
                    )
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
                conn.request("GET", "/readyz")
                resp = conn.getresponse()
                body = resp.read().decode(errors="replace")
                conn.close()
                if resp.status == 200:
                    return
                last = f"/readyz {resp.status}: {body[-500:]}"
            except (OSError, http.client.HTTPException) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {self.start_timeout:.0f}s ({last}); logs in {self.workdir}"
        )


class _PortRace(ControlPlaneError):
    pass


class ExistingCluster:
    """The ControlPlane interface over a cluster somebody else runs (ARBITER_TEST_KUBECONFIG, kind, OpenShift)."""

    def __init__(self, kubeconfig: os.PathLike[str] | str, *, context: str | None = None) -> None:
        import yaml

        self.kubeconfig = pathlib.Path(kubeconfig)
        self.context = context
        doc = yaml.safe_load(self.kubeconfig.read_text())
        ctx_name = context or doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        self._cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        self.server = self._cluster["server"]
        self.pids: dict[str, int] = {}

    def start(self) -> ExistingCluster:
        return self

    def stop(self) -> None:
        """Nothing to stop: the cluster is not ours."""

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig), context=self.context)

    def write_kubeconfig(self, path: os.PathLike[str] | str, *, token: str | None = None, namespace: str = "default",
                         user: str = "token-user") -> pathlib.Path:
        """A kubeconfig for ``token`` against this cluster (client certificates of the original stay out of it)."""
        if token is None:
            raise ValueError("an existing cluster's own credentials are not copied; pass token=")
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": self._cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "cluster", "user": user, "namespace": namespace}}],
            "current-context": "ctx",
        }
        path = pathlib.Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=2)
        return path


def serve_until_interrupted(started_thing: Any, what: str) -> int:
    """`python -m` entry of a local control plane or cluster: start it, print its KUBECONFIG, run until Ctrl-C or a
    signal, stop it."""
    import signal

    started = time.monotonic()
    started_thing.start()
    extra = f" ({started_thing.timings})" if getattr(started_thing, "timings", None) else ""
    print(f"{what} ready in {time.monotonic() - started:.1f}s{extra}: {started_thing.server}", file=sys.stderr)
    print(f"export KUBECONFIG={started_thing.kubeconfig}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        started_thing.stop()
    return 0


def main() -> int:
    return serve_until_interrupted(ControlPlane(), "control plane")


if __name__ == "__main__":
    sys.exit(main())
