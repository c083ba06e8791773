"""The README's first command: run Arbiter end to end on this machine and watch a DecisionModel converge.

    python -m arbiter_devenv.local                        # embedded control plane (default)
    python -m arbiter_devenv.local --use-current-context  # the current kubeconfig context instead
    python -m arbiter_devenv.local --exit-when-ready      # scripted: exit 0 once every example is Ready

With the embedded cluster it starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (simulated
A100 GPU nodes and pod lifecycles) and the real KServe controller with its webhooks (all built from hack/tools),
installs the upstream CRDs and Arbiter's, starts the S3 server (SeaweedFS) with the example model's files (a
config.json and a weights file, so the artifact checks have something real to read) and a KServe storage-config
Secret. Then it runs the operator as a subprocess, applies examples/decisionmodel.yaml, and prints each condition
change until the DecisionModel is Ready: KServe turns the InferenceService into a predictor Deployment, the
scheduler places its pod on a simulated A100 node, and kwok runs it (no container, no GPU: vLLM is not started).

Against a real cluster (--use-current-context) it starts nothing but the operator; the cluster must have KServe and
the Route API, and the example's storageUri must exist in your S3 with a storage-config Secret in the namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import sys
import tempfile
import time
from typing import Any

import yaml

from . import crds
from .tools import repo_root

REPO = repo_root()
EXAMPLE = REPO / "examples" / "decisionmodel.yaml"
CANARY_EXAMPLE = REPO / "examples" / "decisionmodel-canary.yaml"  # where the example's second version comes from
GROUP, VERSION, PLURAL = "arbiter.dev", "v1alpha1", "decisionmodels"

# The example model's storage: what a small Qwen3-style causal LM directory holds. Sixteen attention heads and eight
# KV heads make tensor parallel 1, 2, 4 and 8 valid; 40960 positions leave room for maxModelLen 4096.
EXAMPLE_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "num_hidden_layers": 28,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}


def say(msg: str) -> None:
    print(f"\033[1m[arbiter]\033[0m {msg}", flush=True)


def _seed_example_storage(s3: Any, example: dict[str, Any]) -> None:
    client = s3.client()
    for version in example["spec"]["versions"]:
        bucket, _, prefix = version["storageUri"].removeprefix("s3://").partition("/")
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=json.dumps(EXAMPLE_CONFIG).encode())
        # A weights file: the artifact check verifies it exists, vLLM is not started here.
        client.put_object(Bucket=bucket, Key=f"{prefix}/model.safetensors", Body=b"\0" * 1024)


def second_version_manifest(example: dict[str, Any]) -> dict[str, Any] | None:
    """The applied example with the canary example's next version added and promoted Immediately (this machine has
    no Prometheus to analyse a canary): what "promote the second version" applies here. None when the canary example
    has no version the applied one lacks."""
    canary = yaml.safe_load(CANARY_EXAMPLE.read_text())
    have = {v["name"] for v in example["spec"]["versions"]}
    extra = [v for v in canary["spec"]["versions"] if v["name"] not in have]
    if not extra:
        return None
    body = json.loads(json.dumps(example))
    body["spec"]["versions"].append(extra[0])
    body["spec"]["promote"] = {"version": extra[0]["name"], "strategy": "Immediate"}
    return body


def _storage_config_secret(s3: Any) -> dict[str, Any]:
    entry = {
        "type": "s3",
        "access_key_id": s3.access_key,
        "secret_access_key": s3.secret_key,
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "verify_ssl": "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "storage-config"},
        "type": "Opaque",
        "stringData": {"default": json.dumps(entry)},
    }


def _summary(obj: dict[str, Any]) -> list[str]:
    status = obj.get("status") or {}
    return [
        f"{c['type']}={c['status']} ({c.get('reason', '')}): {c.get('message', '')}"
        for c in status.get("conditions", [])
    ]


def try_next(kubeconfig: str, namespace: str, name: str, example: dict[str, Any], workdir: pathlib.Path,
             address: str | None) -> str:
    """What to do next, as commands to paste: the dashboard, a promotion of the example's second version, diagnose."""
    plugin = f"{REPO / '.venv' / 'bin' / 'kubectl-arbiter'} --kubeconfig {kubeconfig} -n {namespace}"
    kube = f"kubectl --kubeconfig {kubeconfig} -n {namespace}"
    lines = ["try next (the kubectl plugin is .venv/bin/kubectl-arbiter: `kubectl arbiter` with .venv/bin on PATH):",
             f"  every model and its promotions in a web page:\n    {plugin} dashboard   # then open "
             "http://127.0.0.1:8421/"]
    second = second_version_manifest(example)
    if second is not None:
        path = workdir / f"{name}-{second['spec']['promote']['version']}.yaml"
        path.write_text("# examples/decisionmodel.yaml with the next version of examples/decisionmodel-canary.yaml, "
                        "promoted Immediately\n# (no Prometheus here to analyse a canary).\n"
                        + yaml.safe_dump(second, sort_keys=False))
        lines.append(f"  promote the example's second version and follow it (the decision server above keeps "
                     f"answering as the version it started with):\n    {kube} apply --server-side "
                     f"--field-manager arbiter-local -f {path}\n    {plugin} status {name} --watch")
    if address:
        from .first_decision import SRE

        token = f'"$({kube} create token {SRE})"'
        lines.append(f"  ask why it decides as it does (its metrics, conditions and Events):\n    {plugin} diagnose "
                     f"{name} --metrics-url {address} --metrics-token {token}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arbiter-local", description=__doc__.split("\n\n")[0])
    parser.add_argument("--use-current-context", action="store_true", help="run against the current kubeconfig context")
    parser.add_argument("--namespace", default="arbiter-demo", help="namespace to deploy the examples into")
    parser.add_argument("--example", default=str(EXAMPLE), help="DecisionModel manifest to apply")
    parser.add_argument("--exit-when-ready", action="store_true", help="stop everything and exit 0 once Ready")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for Ready (default 300)")
    args = parser.parse_args(argv)

    from kubernetes import client, config

    from . import first_decision
    from .operator_process import OperatorProcess

    stack: list[Any] = []

    def stop_all(*_: Any) -> None:
        while stack:
            item = stack.pop()
            try:
                item.stop()
            except Exception as exc:  # keep stopping the rest
                say(f"stopping {type(item).__name__}: {exc}")

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    example = yaml.safe_load(pathlib.Path(args.example).read_text())
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="arbiter-local-"))
    try:
        if args.use_current_context:
            kubeconfig = os.environ.get("KUBECONFIG", str(pathlib.Path.home() / ".kube" / "config"))
            api = config.new_client_from_config(config_file=kubeconfig)
            say(f"using the current context of {kubeconfig}")
            crds.install_crds(api, crds.arbiter_crd_paths())
        else:
            from .cluster import LocalCluster
            from .s3server import S3Server

            say("starting the local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok "
                "(4 simulated A100 nodes), KServe's controller and webhooks")
            cp = LocalCluster().start()
            stack.append(cp)
            kubeconfig = str(cp.kubeconfig)
            say(f"control plane at {cp.server}; kubeconfig {kubeconfig}  (export KUBECONFIG={kubeconfig})")
            api = cp.api_client()
            crds.install_crds(api, crds.upstream_crd_paths() + crds.stand_in_crd_paths(), replace=False)
            crds.install_crds(api, crds.arbiter_crd_paths())
            say("CRDs installed: KServe's, Route, PodMonitor, ModelRegistry, DecisionModel")

        core = client.CoreV1Api(api)
        try:
            core.create_namespace({"metadata": {"name": args.namespace}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        if not args.use_current_context:
            say("starting the S3 server (SeaweedFS) with the example model's files")
            s3 = S3Server().start()
            stack.append(s3)
            _seed_example_storage(s3, example)
            second = second_version_manifest(example)
            if second is not None:
                _seed_example_storage(s3, second)  # so "promote the second version" below finds its files
            try:
                core.create_namespaced_secret(args.namespace, _storage_config_secret(s3))
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

        say("starting the operator")
        op = OperatorProcess(kubeconfig, [args.namespace], log_dir=workdir).start()
        stack.append(op)
        say(f"operator log: {op.log_path}")

        name = example["metadata"]["name"]
        say(f"applying {args.example} to namespace {args.namespace}")
        custom = client.CustomObjectsApi(api)
        # Server-side apply, as `oc apply --server-side` would; the field manager is the person running this.
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, args.namespace, PLURAL, name, example,
            field_manager="arbiter-local", force=True, _content_type="application/apply-patch+yaml",
        )
        say(f"decisionmodel.arbiter.dev/{name} applied")
        seen: list[str] = []
        deadline = time.monotonic() + args.timeout
        ready = False
        while time.monotonic() < deadline:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL, name)
            lines = _summary(obj)
            for line in lines:
                if line not in seen:
                    say(f"dm/{name}: {line}")
            seen = lines
            gen = obj["metadata"].get("generation")
            status = obj.get("status") or {}
            ready = status.get("observedGeneration") == gen and any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            )
            if ready:
                break
            time.sleep(1.0)
        if not ready:
            say(f"dm/{name} not Ready after {args.timeout:.0f}s; operator log tail:\n{op.log()[-3000:]}")
            return 1
        status = obj.get("status") or {}
        url = f", url {status['url']}" if status.get("url") else ""
        say(f"dm/{name} is Ready: active version {status.get('activeVersion')}{url}")
        cluster = None if args.use_current_context else cp
        stoppables, address = first_decision.run(api, cluster, args.namespace, name, workdir, say)
        stack.extend(stoppables)
        say(try_next(kubeconfig, args.namespace, name, example, workdir, address))
        if args.exit_when_ready:
            return 0
        say("running; Ctrl-C stops everything.")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        say("stopping")
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
