"""The local run's last act: one real decision from the active version, and the `curl` to make another.

After the DecisionModel is Ready, this starts the Arbiter runtime for the active version with the `decision.json`
the operator rendered into that version's ConfigMap, in front of the **vLLM stand-in** (a CPU-only double of
`vllm serve` that speaks vLLM's wire format; there is no GPU and no vLLM on a laptop), with the authentication the
operator rendered for the InferenceService: when `ARBITER_AUTH` is true the runtime checks bearer tokens against the
local kube-apiserver exactly as in a cluster (TokenReview + SubjectAccessReview `get` on the InferenceService), so
this sets up what a platform does: the predictor's ServiceAccount bound to `system:auth-delegator`, and a caller
ServiceAccount allowed to `get` the InferenceService. Then it sends the example application and prints the
decision: trajectory, probabilities, reasoning codes, source and trace id.

Against a real cluster (--use-current-context) nothing is started: the model runs in the cluster, and the user
guide's `curl` against the Route applies.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from arbiter_operator.api.models import isvc_name
from arbiter_operator.render.common import configmap_name

from . import _procs, example_model

# The example application the user guide sends (examples/decisionmodel.yaml's inputSchema), and one the example's
# model sends to review (a history too short to judge).
EXAMPLE_INPUT = {"applicantId": "a-17", "income": 84000, "requestedLimit": 12000, "history": "7y, no defaults"}
THIN_HISTORY = {"applicantId": "a-18", "income": 84000, "requestedLimit": 12000, "history": "4 months"}
CALLER = "arbiter-local-caller"
SRE = "arbiter-local-sre"  # reads the runtime's metrics (diagnose), as Prometheus does on a cluster
# A model other than the example's gets a confident stand-in: this much probability on one label at each label
# position (it has no weights; without it every label would be near-uniform and a confidence threshold would send
# each request to the rules). The example's own model answers by its policy (example_model.py).
STANDIN_CONFIDENCE = 0.92


class _Runtime:
    def __init__(self, proc: Any, log_path: pathlib.Path):
        self.proc, self.log_path = proc, log_path

    def stop(self) -> None:
        _procs.terminate(self.proc)


def _env_of(isvc: dict[str, Any]) -> dict[str, str]:
    model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
    return {e["name"]: str(e.get("value", "")) for e in model.get("env") or [] if "name" in e}


def _grant(api: Any, namespace: str, isvc: str) -> tuple[str, str]:
    """(runtime's own token, caller's token): what OpenShift AI and a project admin set up on a cluster."""
    from kubernetes import client

    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)

    def ensure(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    ensure(core.create_namespaced_service_account, namespace, {"metadata": {"name": CALLER}})
    ensure(rbac.create_cluster_role_binding, {
        "metadata": {"name": f"{namespace}-default-auth-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]})
    ensure(rbac.create_namespaced_role, namespace, {
        "metadata": {"name": f"call-{isvc}"},
        "rules": [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
                   "resourceNames": [isvc], "verbs": ["get"]}]})
    ensure(rbac.create_namespaced_role_binding, namespace, {
        "metadata": {"name": f"{CALLER}-calls-{isvc}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"call-{isvc}"},
        "subjects": [{"kind": "ServiceAccount", "name": CALLER, "namespace": namespace}]})
    # An SRE's reader of metrics (what the chart's metrics-reader ClusterRole grants Prometheus), for diagnose.
    ensure(core.create_namespaced_service_account, namespace, {"metadata": {"name": SRE}})
    ensure(rbac.create_cluster_role, {"metadata": {"name": "arbiter-local-metrics-reader"},
                                      "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    ensure(rbac.create_cluster_role_binding, {
        "metadata": {"name": f"{namespace}-{SRE}-reads-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "arbiter-local-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": SRE, "namespace": namespace}]})

    def token(sa: str) -> str:
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
        return core.create_namespaced_service_account_token(sa, namespace, req).status.token

    return token("default"), token(CALLER)


def _print_decision(say: Callable[[str], None], body: dict[str, Any]) -> None:
    say(f"decision {body['decision']!r} (confidence {body['confidence']:.3f}, source {body['source']}, "
        f"version {body['version']}, trace id {body['traceId']})")
    for step in (body.get("trajectory") or {}).get("steps", []):
        probs = ", ".join(f"{k} {v:.3f}" for k, v in step["probabilities"].items())
        say(f"  step {step['step']}: {step['reasoningCode']:<16} -> {step.get('label', '?'):<9} ({probs})")


def _standin(decision: dict[str, Any], say: Callable[[str], None]) -> Any:
    """The vLLM stand-in for this decision.json: the example's model for the example, else a confident one."""
    from arbiter_devenv.vllm_standin import Behaviour, StandinServer

    labels = decision["labels"]
    ours = tuple(labels) == example_model.LABELS and set(decision["reasoningCodes"]) >= example_model.CODES
    standin = StandinServer(
        words=list(labels) + list(decision["reasoningCodes"]),
        served_model_name=decision["upstream"]["servedModelName"],
        behaviour=Behaviour(distribution={labels[0]: STANDIN_CONFIDENCE,
                                          **{lab: (1 - STANDIN_CONFIDENCE) / (len(labels) - 1) for lab in labels[1:]}}),
        planner=example_model.plan if ours else None,
    ).start()
    if ours:
        say("the stand-in answers as the example's model would: its credit policy, step by step "
            "(devenv/arbiter_devenv/example_model.py)")
    return standin


def run(api: Any, control_plane: Any | None, namespace: str, dm_name: str, workdir: pathlib.Path,
        say: Callable[[str], None]) -> tuple[list[Any], str | None]:
    """Start the stand-in and the runtime, print one decision and the curl; return what must be stopped and the
    decision server's address."""
    if control_plane is None:
        say("the model runs in your cluster: call it through its Route (docs/user-guide.md, 'Ask for a decision')")
        return [], None
    from kubernetes import client

    from arbiter_devenv.vllm_standin import free_port

    custom = client.CustomObjectsApi(api)
    dm = custom.get_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", dm_name)
    version = (dm.get("status") or {}).get("activeVersion")
    isvc = isvc_name(dm_name, version)
    cm = client.CoreV1Api(api).read_namespaced_config_map(configmap_name(dm_name, version), namespace)
    config_path = workdir / "decision.json"
    config_path.write_text(cm.data["decision.json"])
    decision = json.loads(cm.data["decision.json"])
    env_isvc = _env_of(custom.get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", namespace, "inferenceservices", isvc))
    say(f"starting the runtime for version {version} with the decision.json of ConfigMap "
        f"{configmap_name(dm_name, version)}, in front of the vLLM stand-in (no GPU here: a CPU double of "
        "`vllm serve` speaking its wire format, not a model)")

    stoppables: list[Any] = [_standin(decision, say)]
    standin = stoppables[0]

    port = free_port()
    env = {**os.environ, "ARBITER_AUTH": env_isvc.get("ARBITER_AUTH", "false"), "PYTHONUNBUFFERED": "1"}
    caller_token = None
    if env["ARBITER_AUTH"] == "true":
        runtime_token, caller_token = _grant(api, namespace, isvc)
        token_file = workdir / "runtime-token"
        token_file.touch(mode=0o600)
        token_file.write_text(runtime_token)
        env.update(ARBITER_AUTH_API_URL=control_plane.server, ARBITER_AUTH_CA_FILE=str(control_plane.ca_file),
                   ARBITER_AUTH_TOKEN_FILE=str(token_file),
                   ARBITER_AUTH_NAMESPACE=env_isvc.get("ARBITER_AUTH_NAMESPACE", namespace),
                   ARBITER_AUTH_INFERENCESERVICE=env_isvc.get("ARBITER_AUTH_INFERENCESERVICE", isvc))
        say(f"auth is on (spec.exposure.auth): ServiceAccount default bound to system:auth-delegator; "
            f"ServiceAccount {CALLER} may get inferenceservices/{isvc}")
    log_path = workdir / "runtime.log"
    proc = _procs.spawn([sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(config_path),
                         "--upstream", standin.url, "--host", "127.0.0.1", "--port", str(port)],
                        log_path=log_path, env=env)
    stoppables.append(_Runtime(proc, log_path))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as http:
        while True:
            try:
                if http.get("/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the runtime did not become ready; log {log_path}:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        headers = {"Authorization": f"Bearer {caller_token}"} if caller_token else {}
        say(f"POST {url}/v1/decisions {json.dumps(EXAMPLE_INPUT)}")
        r = http.post("/v1/decisions", json=EXAMPLE_INPUT, headers=headers)
    if r.status_code != 200:
        raise RuntimeError(f"the example decision failed: {r.status_code} {r.text}")
    _print_decision(say, r.json())
    kube = f"kubectl --kubeconfig {control_plane.kubeconfig}"
    token_line = f"TOKEN=$({kube} create token {CALLER} -n {namespace}); " if caller_token else ""
    auth = ' -H "Authorization: Bearer $TOKEN"' if caller_token else ""
    say(f"version {version} answers at {url} (this machine has no OpenShift router, so the Route's status.url "
        "stays empty; on a cluster you call the Route). Its audit records, with the caller, are in "
        f"{log_path}. Another case, one with a thin history:\n  {token_line}"
        f"curl -s{auth} -H 'Content-Type: application/json' {url}/v1/decisions -d '{json.dumps(THIN_HISTORY)}'")
    return stoppables, url
