"""Large DecisionModels end to end on the real apiserver, with the real Model Registry and the registry delete
finalizer: a 1 MiB spec applied server-side, and a spec applied client-side (kubectl's last-applied annotation, which
takes the annotations close to their 262,144-byte limit), each created, updated and deleted. The operator writes no
annotation to a DecisionModel, so nothing it writes can push the object over a limit and the delete completes."""

from __future__ import annotations

import copy
import json
import random
import string
import time
import uuid
from typing import Any

import httpx
import pytest
from arbiter_devenv.operator_process import OperatorProcess
from arbiter_operator.kube.client import KubeError
from support.examples import example
from support.kubekit import raw_call
from support.operator_kit import seed_model_storage
from support.paths import REPO
from support.polling import eventually

pytestmark = pytest.mark.cluster

ROOT = REPO
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
FINALIZER = "arbiter.dev/registry-archive"


def _noise(n: int, seed: int) -> str:
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(n))


def _body(name: str, registry_url: str, target_bytes: int) -> dict[str, Any]:
    """examples/decisionmodel.yaml with eight versions whose input schemas bring the object to ~target_bytes."""
    doc = example()
    doc["metadata"] = {"name": name}
    doc["spec"]["model"]["name"] = f"{name}-{uuid.uuid4().hex[:6]}"
    doc["spec"]["registry"] = {"url": registry_url}
    template = doc["spec"]["versions"][0]
    per_version = target_bytes // 8
    doc["spec"]["versions"] = []
    for i in range(8):
        v = copy.deepcopy(template)
        v["name"] = f"1.0.{i}"
        v["storageUri"] = "s3://models/credit-limit/1.0.0"  # same weights: the version name is only a name
        props = v["metadata"]["inputSchema"]["properties"]
        for j in range(per_version // 2000):
            props[f"field{j}"] = {"type": "string", "description": _noise(1960, i * 10_000 + j)}
        doc["spec"]["versions"].append(v)
    doc["spec"]["promote"]["version"] = "1.0.0"
    return doc


def _path(ns: str, name: str = "") -> str:
    return f"/apis/arbiter.dev/v1alpha1/namespaces/{ns}/decisionmodels" + (f"/{name}" if name else "")


def _get(api: Any, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return raw_call(api, "GET", _path(ns, name))
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def _wait(fn: Any, what: str, op: OperatorProcess, timeout: float = 120.0) -> Any:
    return eventually(fn, timeout, what, interval=0.5, context=lambda: op.log()[-4000:])


def _cond(dm: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((dm or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def _ready_and_registered(api: Any, ns: str, name: str, generation: int) -> Any:
    """Reconciled at this generation and registered. (Serving needs KServe, which is not what this test is about:
    the InferenceService is rendered and applied, and the Route waits for it, as with any model still loading.)"""
    def check() -> Any:
        dm = _get(api, ns, name)
        ok = dm and (dm.get("status") or {}).get("observedGeneration") == generation and \
            _cond(dm, "Registered").get("status") == "True" and _cond(dm, "Stalled").get("status") == "False"
        return dm if ok else None
    return check


def _ours(annotations: dict[str, str]) -> list[str]:
    return [k for k in annotations if k.startswith("arbiter.dev/") or "kopf" in k]


@pytest.mark.parametrize("mode", ["server-side", "client-side"])
def test_large_spec_create_update_delete(mode, control_plane, namespace, s3_server, model_registry):
    api = control_plane.api_client()
    seed_model_storage(s3_server, api, namespace)
    op = OperatorProcess(control_plane.kubeconfig, [namespace]).start()
    name = "big"
    try:
        # Server-side: 1 MiB of spec. Client-side: the whole object is repeated in an annotation, and all annotations
        # together may hold 262,144 bytes, so kubectl itself cannot apply more than ~250 KB that way.
        body = _body(name, model_registry.url, 1024 * 1024 if mode == "server-side" else 240 * 1024)
        size = len(json.dumps(body))
        body2 = copy.deepcopy(body)
        body2["spec"]["decision"]["deadlineMs"] = 1500
        if mode == "server-side":
            assert size >= 1024 * 1024
            for doc in (body, body2):
                raw_call(api, "PATCH", _path(namespace, name), json.dumps(doc),
                         [("fieldManager", "gitops"), ("force", "true")], "application/apply-patch+yaml")
                if doc is body:
                    dm = _wait(_ready_and_registered(api, namespace, name, 1), "Ready and Registered", op, 180)
        else:
            assert size >= 240 * 1024
            created = copy.deepcopy(body)
            created["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(body, sort_keys=True)}
            assert len(created["metadata"]["annotations"][LAST_APPLIED]) > 240_000  # close to the 262,144 limit
            raw_call(api, "POST", _path(namespace), created, [("fieldManager", "kubectl-client-side-apply")])
            dm = _wait(_ready_and_registered(api, namespace, name, 1), "Ready and Registered", op, 180)
            # kubectl apply's update: a merge patch of the change plus the new last-applied configuration.
            patch = {"metadata": {"annotations": {LAST_APPLIED: json.dumps(body2, sort_keys=True)}},
                     "spec": {"decision": {"deadlineMs": 1500}}}
            raw_call(api, "PATCH", _path(namespace, name), patch, [("fieldManager", "kubectl-client-side-apply")],
                     "application/merge-patch+json")
        assert FINALIZER in dm["metadata"]["finalizers"]
        dm = _wait(_ready_and_registered(api, namespace, name, 2), "the update reconciled", op, 180)
        assert _ours(dm["metadata"].get("annotations") or {}) == []  # no bookkeeping annotation, ever
        model = dm["spec"]["model"]["name"]

        raw_call(api, "DELETE", _path(namespace, name))
        _wait(lambda: _get(api, namespace, name) is None, "the DecisionModel gone (finalizer removed)", op, 120)

        # The registry holds every version, archived (nothing deleted); the large schemas by reference.
        base = model_registry.api_url
        versions = [httpx.get(f"{base}/model_version", params={"externalId": f"arbiter:{model}:1.0.{i}"},
                              timeout=5).json() for i in range(8)]
        assert [v["name"] for v in versions] == [f"1.0.{i}" for i in range(8)]
        assert {v["state"] for v in versions} == {"ARCHIVED"}
        schema_prop = json.loads(versions[0]["customProperties"]["arbiter.input_schema"]["string_value"])
        assert set(schema_prop) == {"$ref", "sha256", "bytes"}
    finally:
        op.stop()
        api.close()


def test_a_permanent_registry_refusal_is_a_condition_not_a_retry_loop(control_plane, namespace, model_registry):
    """A description the registry's database refuses for good: Registered=False, RegistrationRejected, and the
    registry is not asked again for that spec: reconciles during a registry outage keep the condition (an outage seen
    by a new attempt would turn it Unknown); a spec change asks again."""
    api = control_plane.api_client()
    # debug: every reconcile is logged, also those that write nothing
    op = OperatorProcess(control_plane.kubeconfig, [namespace], extra_args=("--log-level=debug",)).start()
    try:
        body = _body("refused", model_registry.url, 0)
        body["spec"]["model"]["description"] = _noise(4000, 3)  # within the CRD's 4096, beyond the registry's index
        raw_call(api, "POST", _path(namespace), body)

        def rejected() -> Any:
            dm = _get(api, namespace, "refused")
            c = _cond(dm, "Registered")
            return c if c.get("reason") == "RegistrationRejected" else None

        c = _wait(rejected, "RegistrationRejected", op, 60)
        assert c["status"] == "False" and "exceeds btree" in c["message"]
        model_registry.pause()
        try:
            reconciles = op.log().count(f"reconciled {namespace}/")
            patch = {"metadata": {"annotations": {"example.com/poke": "1"}}}  # a reconcile, same generation
            raw_call(api, "PATCH", _path(namespace, "refused"), patch, None, "application/merge-patch+json")
            _wait(lambda: op.log().count(f"reconciled {namespace}/") > reconciles, "a reconcile", op, 30)
            time.sleep(2)  # a measured wait: the condition must not change after the reconcile
            assert _cond(_get(api, namespace, "refused"), "Registered") == c
        finally:
            model_registry.resume()
        # A spec change is a new request: asked again (and, the registry being back, refused again).
        raw_call(api, "PATCH", _path(namespace, "refused"), {"spec": {"model": {"description": _noise(4000, 4)}}},
                 None, "application/merge-patch+json")
        _wait(lambda: (d := _get(api, namespace, "refused")) and _cond(d, "Registered").get("observedGeneration") == 2
              and _cond(d, "Registered").get("reason") == "RegistrationRejected", "refused again at generation 2", op)
    finally:
        op.stop()
        api.close()
