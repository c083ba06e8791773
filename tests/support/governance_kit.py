"""Harness for the governance tests (who may call, context routing, where the audit goes): the real operator on the
local cluster (KServe's controller, the scheduler, kwok's simulated predictor pods), with each version's predictor pod
played by a REAL decision server (tests/support/runtime_procs.py) whose auth is on against the real apiserver:
TokenReview and SubjectAccessReview on `get` of that version's InferenceService, as the operator renders it.

What the cluster here does not do is played in the open:
- kube-proxy: "through the stable Service" is the Service `<dm>` read from the apiserver, its selector's version
  label, and the request sent to that version's decision server (`via_stable`);
- the kubelet: what the operator puts in a version's ConfigMap for the runtime to read live (routing.json) is copied
  next to that version's decision.json (`sync_live_files`), and what it renders into the InferenceService's container
  environment (the audit's settings) is handed to the process that plays the pod (`rendered_env`);
- cluster DNS: a URL `http://<isvc>-predictor.<ns>.svc.cluster.local` the operator writes is pointed at that version's
  process.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from arbiter_devenv.operator_process import OperatorProcess
from arbiter_operator.api.models import isvc_name
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.decision_e2e_kit import decision_file
from support.identities import bind_auth_delegator, service_account_token
from support.operator_kit import seed_model_storage
from support.plannerdrive import two_versions
from support.polling import eventually
from support.runtime_procs import RuntimeFleet, RuntimeProc

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
V1, V2 = "1.0.0", "1.1.0"
NAME = "credit-limit"
DOC = {"amount": 120, "country": "DE"}


class Governed:
    def __init__(self, control_plane: Any, namespace: str, s3: Any, workdir: pathlib.Path, name: str = NAME):
        self.cp, self.ns, self.s3, self.workdir, self.name = control_plane, namespace, s3, workdir, name
        self.api = control_plane.api_client()
        self.objs = client.CustomObjectsApi(self.api)
        seed_model_storage(s3, self.api, namespace)
        # The predictor pods' ServiceAccount: reviews callers (system:auth-delegator, as OpenShift AI binds it).
        token_file = workdir / "runtime-token"
        token_file.write_text(service_account_token(self.api, namespace, "default"))
        self._delegator = bind_auth_delegator(self.api, namespace, "default")
        self.auth_env = {"ARBITER_AUTH": "true", "ARBITER_AUTH_API_URL": control_plane.server,
                         "ARBITER_AUTH_CA_FILE": str(control_plane.ca_file),
                         "ARBITER_AUTH_TOKEN_FILE": str(token_file), "ARBITER_AUTH_NAMESPACE": namespace,
                         "ARBITER_AUTH_CACHE_TTL_S": "1"}
        self.operator = OperatorProcess(control_plane.kubeconfig, [namespace], log_dir=workdir / "operator")
        self.fleet = RuntimeFleet(workdir / "runtimes", namespace=namespace, model=name)
        self.procs: dict[str, RuntimeProc] = {}

    # -- the DecisionModel -------------------------------------------------------------------------------------------
    def create(self, promote: str = V1, spec: dict[str, Any] | None = None, **promote_fields: Any) -> None:
        for v in (V1, V2):
            self.set_fate(v, "loading")
        body = two_versions(promote, **promote_fields)
        body["metadata"] = {"name": self.name, "namespace": self.ns}
        body["spec"].update(spec or {})
        self.objs.create_namespaced_custom_object(G, V, self.ns, P, body)

    def patch_spec(self, patch: dict[str, Any], manager: str = "release-pipeline") -> None:
        self.objs.patch_namespaced_custom_object(G, V, self.ns, P, self.name, {"spec": patch},
                                                 field_manager=manager)

    def annotate(self, key: str, value: str) -> None:
        self.objs.patch_namespaced_custom_object(G, V, self.ns, P, self.name,
                                                 {"metadata": {"annotations": {key: value}}})

    def dm(self) -> dict[str, Any]:
        return self.objs.get_namespaced_custom_object(G, V, self.ns, P, self.name)

    def promotion(self) -> dict[str, Any]:
        return (self.dm().get("status") or {}).get("promotion") or {}

    def condition(self, type_: str) -> dict[str, Any]:
        return next((c for c in (self.dm().get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    def set_fate(self, version: str, fate: str) -> None:
        """kwok's simulated predictor pods of `version`: ready | loading | crashloop."""
        self.cp.set_fate(self.ns, isvc_name(self.name, version), fate)

    def isvcs(self) -> set[str]:
        items = self.objs.list_namespaced_custom_object("serving.kserve.io", "v1beta1", self.ns, "inferenceservices",
                                                        label_selector=f"arbiter.dev/decision-model={self.name}")
        return {i["metadata"]["labels"]["arbiter.dev/version"] for i in items["items"]
                if not i["metadata"].get("deletionTimestamp")}

    # -- the pods' stand-ins -----------------------------------------------------------------------------------------
    def start_runtime(self, version: str, env: dict[str, str] | None = None) -> RuntimeProc:
        """The version's decision server, auth on: `get` on this version's InferenceService decides who may call."""
        auth = {**self.auth_env, "ARBITER_AUTH_INFERENCESERVICE": isvc_name(self.name, version)}
        proc = self.fleet.start_version(version, env={**auth, **(env or {})})
        self.procs[version] = proc
        return proc

    def rendered_env(self, version: str) -> dict[str, str]:
        """The runtime container's environment as the operator rendered it on the version's InferenceService (plain
        values; a Secret's key is read from the Secret, as the kubelet resolves secretKeyRef)."""
        isvc = self.objs.get_namespaced_custom_object("serving.kserve.io", "v1beta1", self.ns, "inferenceservices",
                                                      isvc_name(self.name, version))
        out: dict[str, str] = {}
        for item in isvc["spec"]["predictor"]["model"].get("env") or []:
            if "value" in item:
                out[item["name"]] = item["value"]
            elif ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                secret = client.CoreV1Api(self.api).read_namespaced_secret(ref["name"], self.ns)
                import base64

                out[item["name"]] = base64.b64decode((secret.data or {})[ref["key"]]).decode()
        return out

    def stable_version(self) -> str | None:
        """The version the stable Service `<dm>` selects (what kube-proxy would send its traffic to)."""
        try:
            svc = client.CoreV1Api(self.api).read_namespaced_service(self.name, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return (svc.spec.selector or {}).get("arbiter.dev/version")

    def via_stable(self, token: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        version = self.stable_version()
        assert version in self.procs, f"the stable Service selects {version!r}, which no process plays"
        return self.procs[version].call(DOC, headers={"Authorization": f"Bearer {token}", **(headers or {})})

    def live_file(self, version: str, key: str) -> str | None:
        """A key of the version's decision ConfigMap as the apiserver holds it (None: absent)."""
        return decision_file(self.api, self.ns, self.name, version, key)

    def dns(self, url: str) -> str:
        """Cluster DNS for a predictor Service URL the operator wrote: the loopback URL of that version's process."""
        for version, proc in self.procs.items():
            if url.rstrip("/") == f"http://{isvc_name(self.name, version)}-predictor.{self.ns}.svc.cluster.local":
                return proc.url
        raise AssertionError(f"{url!r} names no predictor Service of {self.name} in {self.ns}")

    def sync_live_files(self, key: str) -> None:
        """The kubelet for one live file (e.g. routing.json): each process gets its version's ConfigMap key, with
        the URLs the operator wrote resolved by `dns`; a key the ConfigMap no longer has is removed."""
        for version, proc in self.procs.items():
            text = self.live_file(version, key)
            path = proc.workdir / key
            if text is None:
                path.unlink(missing_ok=True)
                continue
            doc = json.loads(text)
            for route in doc.get("routes") or []:
                route["url"] = self.dns(route["url"])
            tmp = proc.workdir / f".{key}.tmp"
            tmp.write_text(json.dumps(doc))
            tmp.replace(path)

    # -- waiting and closing -----------------------------------------------------------------------------------------
    def wait(self, pred: Any, what: str, timeout: float = 90.0) -> Any:
        return eventually(pred, timeout, what, interval=0.2,
                          ignoring=(KeyError, TypeError, IndexError, AssertionError, ApiException),
                          context=lambda: "operator log tail:\n" + "\n".join(self.operator_log().splitlines()[-30:]))

    def operator_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.operator.log_dir.glob("operator-*.log")))

    def close(self) -> None:
        self.operator.stop()
        self.fleet.stop()
        try:
            client.RbacAuthorizationV1Api(self.api).delete_cluster_role_binding(self._delegator)
        finally:
            self.api.close()
