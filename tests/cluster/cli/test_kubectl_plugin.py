"""`kubectl arbiter` as an SRE meets it: kubectl's flags, one-line errors with documented exit codes (against the real
apiserver, a closed port, a server that never answers, a ServiceAccount without rights), completion, Argo CD marks."""

from __future__ import annotations

import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from arbiter_operator.cli import kubectl_arbiter as plugin
from arbiter_operator.cli.completion import candidates
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from support.examples import example
from support.paths import REPO

ROOT = REPO
G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
DOCUMENTED_CODES = set(range(9))


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The installed entry point, as kubectl runs it: what the user sees on stdout/stderr and the exit code."""
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "arbiter_operator.cli.kubectl_arbiter", *args], text=True,
                          capture_output=True, env={**base, **(env or {})}, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def kubeconfig_for(control_plane, tmp_path: pathlib.Path, server: str | None = None, **kw) -> pathlib.Path:
    path = control_plane.write_kubeconfig(tmp_path / f"kc-{uuid.uuid4().hex[:6]}", **kw)
    if server is not None:
        doc = json.loads(path.read_text())
        doc["clusters"][0]["cluster"]["server"] = server
        path.write_text(json.dumps(doc))
    return path


def decisionmodel(control_plane, namespace: str, **metadata) -> str:
    body = example()
    body["metadata"] = {"name": f"dm-{uuid.uuid4().hex[:6]}", **metadata}
    api = control_plane.api_client()
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, P, body)
    finally:
        api.close()
    return body["metadata"]["name"]


# -- without a cluster --------------------------------------------------------------------------------------------


def test_no_kubeconfig_is_one_line_and_exit_4(tmp_path):
    proc = cli("status", "credit-limit", env={"HOME": str(tmp_path)})
    assert proc.returncode == plugin.EXIT_CONFIG
    assert "no kubeconfig" in one_line_error(proc) and "--kubeconfig" in proc.stderr

    broken = tmp_path / "broken"
    broken.write_text("clusters: [this is: not: yaml")
    proc = cli("--kubeconfig", str(broken), "status", "x")
    assert proc.returncode == plugin.EXIT_CONFIG and str(broken) in one_line_error(proc)


def test_version_and_help_name_the_exit_codes():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("kubectl-arbiter ") and "unknown" not in proc.stdout
    proc = cli("--help")
    assert "--request-timeout" in proc.stdout and "6 unauthorized or forbidden" in proc.stdout.replace("\n", " ")


@pytest.mark.parametrize("text,seconds", [("0", None), ("30", 30), ("10s", 10), ("1m30s", 90), ("500ms", 0.5),
                                          ("2h", 7200)])
def test_request_timeout_reads_like_kubectl(text, seconds):
    assert plugin.parse_timeout(text) == seconds


@given(st.text(max_size=12))
def test_request_timeout_rejects_what_is_not_a_duration(text):
    try:
        value = plugin.parse_timeout(text)
    except Exception as exc:  # argparse turns this into a usage error (exit 2)
        assert type(exc).__name__ == "ArgumentTypeError"
    else:
        assert value is None or value > 0


def test_argo_cd_is_recognised_by_its_own_marks_only():
    helm = {"metadata": {"labels": {"app.kubernetes.io/instance": "my-release",
                                    "app.kubernetes.io/managed-by": "Helm"}}}
    assert not plugin.gitops_managed(helm)  # a Helm release label is not Argo CD
    assert plugin.gitops_managed(helm, tracking_label="app.kubernetes.io/instance")  # label tracking configured
    assert not plugin.gitops_managed(helm, tracking_label="argocd.argoproj.io/instance")
    argo = {"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": "app:arbiter.dev/DecisionModel:ns/x"}}}
    assert plugin.gitops_managed(argo)


def test_completion_offers_commands_flags_and_choices():
    p = plugin.parser()
    assert candidates(p, ["pr"]) == ["promote"]
    assert "--request-timeout" in candidates(p, ["status", "--req"])
    assert candidates(p, ["promote", "dm", "1.1.0", "--strategy", ""]) == ["Canary", "Immediate", "Shadow"]
    assert candidates(p, ["completion", ""]) == ["bash", "zsh"]


def test_bash_completion_script_completes_in_a_real_bash(tmp_path):
    script = tmp_path / "c.bash"
    script.write_text(cli("completion", "bash").stdout)
    shim = tmp_path / "bin" / "kubectl-arbiter"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m arbiter_operator.cli.kubectl_arbiter \"$@\"\n")
    shim.chmod(0o755)
    probe = (f"source {script}; COMP_WORDS=(kubectl-arbiter his); COMP_CWORD=1; _kubectl_arbiter; "
             'printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}"})
    assert out.stdout.split() == ["history"], out.stderr


def test_kubectl_complete_entry_point_speaks_cobras_format():
    out = subprocess.run([sys.executable, "-c", "from arbiter_operator.cli.completion import kubectl_complete as k;"
                          "import sys; sys.exit(k(['ab']))"], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["abort", ":4"]


def test_krew_manifest_matches_the_package():
    manifest = yaml.safe_load((ROOT / "plugins" / "krew" / "arbiter.yaml").read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == "arbiter"
    assert manifest["spec"]["version"] == f"v{plugin.plugin_version()}"
    for platform in manifest["spec"]["platforms"]:
        assert platform["bin"] == "kubectl-arbiter"
        assert f"v{plugin.plugin_version()}" in platform["uri"]


# -- against the real apiserver -----------------------------------------------------------------------------------


@pytest.mark.cluster
def test_not_found_is_exit_7_naming_the_object(control_plane, namespace, tmp_path):
    kc = kubeconfig_for(control_plane, tmp_path)
    proc = cli("--kubeconfig", str(kc), "status", "nope", "-n", namespace)
    assert proc.returncode == plugin.EXIT_NOT_FOUND
    assert f'"nope" not found in namespace "{namespace}"' in one_line_error(proc)


@pytest.mark.cluster
def test_unknown_context_is_exit_4(control_plane, tmp_path):
    kc = kubeconfig_for(control_plane, tmp_path)
    proc = cli("--kubeconfig", str(kc), "--context", "elsewhere", "status", "x")
    assert proc.returncode == plugin.EXIT_CONFIG and "elsewhere" in one_line_error(proc)


@pytest.mark.cluster
def test_closed_port_is_exit_5_quickly(control_plane, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    kc = kubeconfig_for(control_plane, tmp_path, server=f"https://127.0.0.1:{port}")
    proc = cli("--kubeconfig", str(kc), "status", "x", timeout=30)
    assert proc.returncode == plugin.EXIT_UNREACHABLE
    assert f"cannot reach the apiserver https://127.0.0.1:{port}" in one_line_error(proc)


@pytest.mark.cluster
def test_silent_server_is_exit_5_within_the_request_timeout(control_plane, tmp_path):
    with socket.socket() as silent:  # accepts connections (backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        kc = kubeconfig_for(control_plane, tmp_path, server=f"https://127.0.0.1:{silent.getsockname()[1]}")
        proc = cli("--kubeconfig", str(kc), "--request-timeout", "1s", "status", "x", timeout=30)
    assert proc.returncode == plugin.EXIT_UNREACHABLE
    assert "did not answer within --request-timeout" in one_line_error(proc)


@pytest.fixture
def service_account_token(control_plane, namespace):
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(
        name="no-rights")))
    token = core.create_namespaced_service_account_token(
        "no-rights", namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    yield token
    api.close()


@pytest.mark.cluster
def test_service_account_without_rights_is_exit_6(control_plane, namespace, tmp_path, service_account_token):
    name = decisionmodel(control_plane, namespace)
    kc = kubeconfig_for(control_plane, tmp_path, token=service_account_token, namespace=namespace)
    proc = cli("--kubeconfig", str(kc), "status", name)
    assert proc.returncode == plugin.EXIT_FORBIDDEN
    line = one_line_error(proc)
    assert "forbidden" in line and f"system:serviceaccount:{namespace}:no-rights" in line
    assert service_account_token not in proc.stderr + proc.stdout


@pytest.mark.cluster
def test_as_and_as_group_impersonate_like_kubectl(control_plane, namespace, tmp_path):
    name = decisionmodel(control_plane, namespace)
    api = control_plane.api_client()
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="dm-reader"),
        rules=[client.V1PolicyRule(api_groups=[G], resources=[P], verbs=["get", "list"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="sre-readers"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="dm-reader"),
        subjects=[client.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="Group", name="sre")]))
    api.close()
    kc = str(kubeconfig_for(control_plane, tmp_path))
    base = ["--kubeconfig", kc, "-n", namespace]
    proc = cli(*base, "--as", "alice", "status", name)
    assert proc.returncode == plugin.EXIT_FORBIDDEN and '"alice"' in one_line_error(proc)
    # Two groups: both headers reach the apiserver (the second one carries the grant).
    proc = cli(*base, "--as", "alice", "--as-group", "developers", "--as-group", "sre", "status", name)
    assert proc.returncode == 0, proc.stderr
    assert f"Name:        {namespace}/{name}" in proc.stdout
    proc = cli(*base, "--as", "alice", "--as-group", "sre", "retry", name)  # reading is allowed, patching is not
    assert proc.returncode in (plugin.EXIT_REFUSED, plugin.EXIT_FORBIDDEN)


@pytest.mark.cluster
def test_helm_instance_label_does_not_stop_promote(control_plane, namespace, tmp_path):
    """A DecisionModel installed by a Helm release carries app.kubernetes.io/instance; that is not Argo CD."""
    name = decisionmodel(control_plane, namespace, labels={"app.kubernetes.io/instance": "risk-models"})
    api = control_plane.api_client()
    objs = client.CustomObjectsApi(api)
    body = objs.get_namespaced_custom_object(G, V, namespace, P, name)
    versions = body["spec"]["versions"]
    extra = dict(versions[0], name="1.1.0", storageUri=versions[0]["storageUri"].replace("1.0.0", "1.1.0"))
    objs.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": {"versions": [*versions, extra]}})
    kc = str(kubeconfig_for(control_plane, tmp_path))
    out = io.StringIO()
    code = plugin.main(["--kubeconfig", kc, "-n", namespace, "promote", name, "1.1.0"], out=out)
    assert code == 0 and objs.get_namespaced_custom_object(G, V, namespace, P, name)["spec"]["promote"][
        "version"] == "1.1.0"
    # With Argo CD configured for label tracking on that key, the same label means Argo CD: refused, nothing changed.
    objs.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": {"promote": {"version": "1.0.0"}}})
    code = plugin.main(["--kubeconfig", kc, "-n", namespace, "promote", name, "1.1.0", "--argocd-tracking-label",
                        "app.kubernetes.io/instance"], out=io.StringIO())
    assert code == plugin.EXIT_GITOPS
    assert objs.get_namespaced_custom_object(G, V, namespace, P, name)["spec"]["promote"]["version"] == "1.0.0"
    api.close()


# -- a hostile apiserver ------------------------------------------------------------------------------------------


class _Hostile(BaseHTTPRequestHandler):
    answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")

    def _reply(self) -> None:
        status, headers, body = type(self).answer
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = _reply

    def log_message(self, *a) -> None:
        pass


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kc = tmp_path_factory.mktemp("hostile") / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "h",
        "clusters": [{"name": "h", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "h", "user": {"token": "t"}}],
        "contexts": [{"name": "h", "context": {"cluster": "h", "user": "h", "namespace": "ns"}}]}))
    yield kc
    server.shutdown()
    server.server_close()


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=12)
decision_model_like = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.just("dm"), "namespace": st.just("ns")}) | json_values,
    "spec": json_values, "status": json_values})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 201, 400, 401, 403, 404, 409, 422, 429, 500, 502, 503]),
       body=st.one_of(decision_model_like.map(lambda d: json.dumps(d).encode()), st.binary(max_size=64),
                      json_values.map(lambda d: json.dumps(d).encode())),
       command=st.sampled_from([["status", "dm"], ["status", "dm", "-o", "json"], ["history", "dm"],
                                ["retry", "dm"], ["abort", "dm"], ["approve", "dm"],
                                ["promote", "dm", "1.1.0"]]))
def test_any_answer_ends_in_a_documented_exit_code(hostile, capsys, status, body, command):
    _Hostile.answer = (status, {"Content-Type": "application/json"}, body)
    code = plugin.main(["--kubeconfig", str(hostile), "--request-timeout", "5s", *command], out=io.StringIO())
    assert code in DOCUMENTED_CODES
    err = capsys.readouterr().err
    if code != 0:
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    if status in (401, 403):
        assert code == plugin.EXIT_FORBIDDEN
