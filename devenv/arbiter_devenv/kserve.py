"""The real KServe controller manager (``github.com/kserve/kserve/cmd/manager``) next to a local control plane: v0.17.0
by default, or another line (``KSERVE_0_15``: the 0.15 line behind OpenShift AI 2.x) for the tests that compare them.

What ``KServeController.start`` does, in order:
1. installs the KServe CRDs of the module its controllers use (``config/crd/full``, subfolders included; kustomize
   patches and the separate llmisvc controller's LLMInferenceService CRDs skipped);
2. creates the ``kserve`` namespace and KServe's ``inferenceservice-config`` ConfigMap, taken from the module and set
   the way OpenShift AI sets it (see ``openshift_ai_config``);
3. starts the controller with a webhook serving certificate from the control plane's CA (controller-runtime reads it
   from ``$TMPDIR/k8s-webhook-server/serving-certs``; each controller gets its own TMPDIR);
4. registers KServe's webhooks (``config/webhook/manifests.yaml``: InferenceService defaulter and validator, the pod
   mutator that injects the storage initializer, the ServingRuntime validator, ...) in the apiserver, pointing at
   ``https://127.0.0.1:<port>`` with the CA bundle, once the webhook server answers.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import pathlib
import socket
import ssl
import time
from typing import Any

from . import _procs
from ._procs import free_port
from .crds import GoModuleFiles, install_crds

__all__ = ["KSERVE_0_15", "KSERVE_0_17", "KSERVE_MODULE", "STORAGE_INITIALIZER_IMAGE", "KServeController", "KServeLine",
           "kserve_crd_paths", "openshift_ai_config"]

KSERVE_MODULE = GoModuleFiles("github.com/kserve/kserve", "v0.17.0", ("config/crd/full/kustomization.yaml",))
NAMESPACE = "kserve"
CONFIGMAP = "inferenceservice-config"
# The storage initializer image OpenShift AI configures (it is never pulled here: kwok runs no containers).
STORAGE_INITIALIZER_IMAGE = "quay.io/opendatahub/kserve-storage-initializer:v0.17"


@dataclasses.dataclass(frozen=True)
class KServeLine:
    """One KServe release: the tool that builds its manager (hack/tools/<tool>) and the module its CRDs,
    ConfigMap and webhook manifests come from (the same version)."""

    tool: str
    module: GoModuleFiles


KSERVE_0_17 = KServeLine("kserve-controller", KSERVE_MODULE)
# The 0.15 line: OpenShift AI 2.x's KServe is a fork of v0.15.2 (docs/install.md, "Supported versions").
KSERVE_0_15 = KServeLine("kserve-controller-0.15", GoModuleFiles("github.com/kserve/kserve", "v0.15.2",
                                                                 ("config/crd/full/kustomization.yaml",)))


def _module_dir(line: KServeLine = KSERVE_0_17) -> pathlib.Path:
    return line.module.download()


# The LLMInferenceService CRDs belong to KServe's separate llmisvc controller (cmd/llmisvc), which the local cluster
# does not run; the manager started here (cmd/manager) neither watches nor serves them. They are 4.4 MB of the 5 MB of
# KServe's schemas, and the apiserver's digest of them was most of a cluster's start-up (about 35 s of 50 s on two
# cores, over 100 s under load).
_NOT_SERVED = ("llmisvc",)


def kserve_crd_paths(line: KServeLine = KSERVE_0_17) -> list[pathlib.Path]:
    """Every CRD file under config/crd/full that the manager's controllers use (kustomize patches, kustomization
    files and the llmisvc controller's CRDs excluded)."""
    root = _module_dir(line) / "config" / "crd" / "full"
    return sorted(p for p in root.rglob("*.yaml")
                  if p.name.startswith("serving.kserve.io_") and not set(p.relative_to(root).parts) & set(_NOT_SERVED))


def openshift_ai_config(stock: dict[str, str]) -> dict[str, str]:
    """KServe's stock ConfigMap data changed the way OpenShift AI's operator sets it: Standard (RawDeployment) as the
    default mode, no Ingress creation (Routes come from the platform), OpenShift AI's storage initializer image, and
    the ``storage-config`` Secret as the storage-spec credentials."""
    data = dict(stock)

    def edit(key: str, **changes: Any) -> None:
        doc = json.loads(data[key])
        doc.update(changes)
        data[key] = json.dumps(doc, indent=2)

    edit("deploy", defaultDeploymentMode="RawDeployment")
    edit("ingress", disableIngressCreation=True, disableIstioVirtualHost=True)
    edit("storageInitializer", image=STORAGE_INITIALIZER_IMAGE)
    edit("credentials", storageSpecSecretName="storage-config")
    return data


def _configmap(line: KServeLine = KSERVE_0_17) -> dict[str, Any]:
    import yaml

    stock = yaml.safe_load((_module_dir(line) / "config" / "configmap" / "inferenceservice.yaml").read_text())
    data = {k: v for k, v in stock["data"].items() if not k.startswith("_")}  # "_example" is documentation
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
        "data": openshift_ai_config(data),
    }


def webhook_configurations(port: int, ca_pem: bytes, line: KServeLine = KSERVE_0_17) -> list[dict[str, Any]]:
    """KServe's webhook configurations with the in-cluster Service replaced by a URL on 127.0.0.1."""
    import yaml

    manifests = _module_dir(line) / "config" / "webhook" / "manifests.yaml"
    docs = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        doc["metadata"].pop("creationTimestamp", None)
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hook.setdefault("timeoutSeconds", 10)
        out.append(doc)
    return out


class KServeController:
    """Start with ``start(control_plane, api_client)``; ``stop()`` stops the process and removes the webhooks."""

    def __init__(self, workdir: pathlib.Path, line: KServeLine = KSERVE_0_17) -> None:
        self.workdir = workdir
        self.line = line
        self.webhook_port = 0
        self._proc: Any = None
        self._api: Any = None
        self._webhooks: list[tuple[str, str]] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def install(self, api_client: Any) -> None:
        """CRDs, namespace and ConfigMap: what the controller reads at start-up."""
        from kubernetes import client

        install_crds(api_client, kserve_crd_paths(self.line), timeout=120.0)
        core = client.CoreV1Api(api_client)
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE,
                                                "labels": {"control-plane": "kserve-controller-manager"}}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        body = _configmap(self.line)
        try:
            core.create_namespaced_config_map(NAMESPACE, body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_config_map(CONFIGMAP, NAMESPACE, body)

    def start(self, control_plane: Any, api_client: Any, kubeconfig: os.PathLike[str] | str | None = None, *,
              timeout: float = 120.0) -> KServeController:
        from .tools import ensure_tool

        binary = ensure_tool(self.line.tool)
        self._api = api_client
        self.install(api_client)
        tmp = self.workdir / "kserve-tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        control_plane.issue_serving_certificate(certs, "tls")
        self.webhook_port = free_port()
        probe_port = free_port()
        self._proc = _procs.spawn(
            [
                str(binary),
                f"-kubeconfig={kubeconfig or control_plane.kubeconfig}",
                "-metrics-addr=0",
                f"-health-probe-addr=127.0.0.1:{probe_port}",
                f"-webhook-port={self.webhook_port}",
                "-leader-elect=false",
                "-zap-log-level=info",
            ],
            log_path=self.workdir / "kserve-controller.log",
            env={**os.environ, "TMPDIR": str(tmp), "POD_NAMESPACE": NAMESPACE},
        )
        self._wait_serving(pathlib.Path(control_plane.ca_file), timeout)
        self._register(pathlib.Path(control_plane.ca_file).read_bytes())
        return self

    def _wait_serving(self, ca_file: pathlib.Path, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(ca_file))
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            self.check()
            try:
                with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=2) as sock:
                    with ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                        return
            except (OSError, ssl.SSLError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise RuntimeError(f"KServe webhook server not serving after {timeout:.0f}s ({last}); log in {self.workdir}")

    def _register(self, ca_pem: bytes) -> None:
        from kubernetes import client

        adm = client.AdmissionregistrationV1Api(self._api)
        for doc in webhook_configurations(self.webhook_port, ca_pem, self.line):
            name = doc["metadata"]["name"]
            if doc["kind"] == "MutatingWebhookConfiguration":
                create, delete = adm.create_mutating_webhook_configuration, adm.delete_mutating_webhook_configuration
                kind = "mutating"
            else:
                create = adm.create_validating_webhook_configuration
                delete, kind = adm.delete_validating_webhook_configuration, "validating"
            try:
                create(doc)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                delete(name)
                create(doc)
            self._webhooks.append((kind, name))

    def check(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            log = (self.workdir / "kserve-controller.log").read_text(errors="replace")
            raise RuntimeError(
                f"KServe controller exited with code {self._proc.returncode}:\n" + "\n".join(log.splitlines()[-20:])
            )

    def stop(self) -> None:
        _procs.terminate(self._proc)
        self._proc = None

