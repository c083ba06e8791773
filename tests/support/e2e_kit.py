"""End-to-end harness: the real operator process, the real cluster (KServe's controller, the scheduler, kwok's
simulated predictor pods, steered per version), a real Prometheus scraping workload stand-ins. Used by
tests/cluster/promotion/test_promotion_e2e.py and benchmarks/promotion_overhead.py."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiter_devenv.operator_process import OperatorProcess
from arbiter_operator.api.models import isvc_name
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.operator_kit import seed_model_storage
from support.paths import REPO
from support.plannerdrive import two_versions
from support.polling import eventually
from support.promstack import PromStack, Target

G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"
ROOT = REPO
SNAPSHOTS = Path(__file__).with_name("snapshots")
V1, V2 = "1.0.0", "1.1.0"



def fast_canary(**promote: Any) -> dict[str, Any]:
    """Short holds and windows so a promotion takes seconds (the bounds of the API allow it)."""
    base = {
        "strategy": "Canary",
        "steps": [{"weight": 10, "holdSeconds": 6}, {"weight": 50, "holdSeconds": 6}],
        "progressDeadlineSeconds": 60,
        "rollbackWindowSeconds": 600,
        "analysis": {"intervalSeconds": 5, "maxErrorRate": 0.05, "minRequests": 20, "insufficientTraffic": "Wait"},
    }
    base.update(promote)
    return base


class E2E:
    def __init__(self, control_plane: Any, namespace: str, stack: PromStack, workdir: Path, s3: Any,
                 name: str = "credit"):
        self.cp, self.ns, self.stack, self.workdir, self.name = control_plane, namespace, stack, workdir, name
        self.api = control_plane.api_client()
        self.objs = client.CustomObjectsApi(self.api)
        seed_model_storage(s3, self.api, namespace)  # the operator deploys a version only once its artifacts check
        # Every version's predictor loads (never ready) until a test says otherwise with set_state.
        for v in (V1, V2):
            self.set_state(v, "pending")
        self.operator = OperatorProcess(
            control_plane.kubeconfig, [namespace], log_dir=workdir / f"operator-{namespace}",
            env={"ARBITER_PROMETHEUS_URL": stack.url, "ARBITER_RESYNC_SECONDS": "30"},
        )
        self.pods: dict[str, Target] = {}

    # -- processes ---------------------------------------------------------------------------------------------------
    def start_operator(self) -> None:
        self.operator.start()

    def kill_operator(self) -> None:
        """SIGKILL: no cleanup, no final status write, like a node loss."""
        self.operator.kill()

    def close(self) -> None:
        self.operator.stop()
        self.api.close()

    def operator_log(self) -> str:
        """Every run's log, in order (the operator may have been killed and restarted)."""
        logs = sorted(self.operator.log_dir.glob("operator-*.log"), key=lambda p: int(p.stem.split("-")[1]))
        return "".join(p.read_text(errors="replace") for p in logs)

    # -- the DecisionModel ------------------------------------------------------------------------------------------
    def create(self, promote_version: str = V1, **promote: Any) -> None:
        body = two_versions(promote_version, **promote)
        body["metadata"] = {"name": self.name, "namespace": self.ns}
        self.objs.create_namespaced_custom_object(G, V, self.ns, P, body)
        for v in (V1, V2):
            if v not in self.pods:
                self.pods[v] = self.stack.add_workload(self.ns, self.name, v)
                self.pods[v].control(rps=40, latency_ms=40, error_rate=0.0)

    def dm(self) -> dict[str, Any]:
        return self.objs.get_namespaced_custom_object(G, V, self.ns, P, self.name)

    def patch_promote(self, **promote: Any) -> None:
        self.objs.patch_namespaced_custom_object(
            G, V, self.ns, P, self.name, {"spec": {"promote": promote}}, _content_type="application/merge-patch+json"
        )

    def annotate(self, key: str, value: str) -> None:
        self.objs.patch_namespaced_custom_object(
            G, V, self.ns, P, self.name, {"metadata": {"annotations": {key: value}}},
            _content_type="application/merge-patch+json",
        )

    def promotion(self) -> dict[str, Any]:
        return (self.dm().get("status") or {}).get("promotion") or {}

    def condition(self, type_: str, dm: dict[str, Any] | None = None) -> dict[str, Any] | None:
        dm = dm or self.dm()
        return next((c for c in (dm.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)

    # -- children ---------------------------------------------------------------------------------------------------
    def isvcs(self) -> dict[str, dict[str, Any]]:
        """version -> InferenceService, for those that exist and are not being deleted."""
        items = self.objs.list_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", self.ns, "inferenceservices",
            label_selector=f"arbiter.dev/decision-model={self.name}",
        )["items"]
        return {
            i["metadata"]["labels"]["arbiter.dev/version"]: i
            for i in items
            if not i["metadata"].get("deletionTimestamp")
        }

    def set_state(self, version: str, state: str) -> None:
        """Steer this version's predictor pods (ready | pending: loading, never ready | failed: crash loop) through
        kwok; KServe's controller turns that into the InferenceService's status."""
        name = isvc_name(self.name, version)
        self.cp.set_fate(self.ns, name, {"ready": "ready", "pending": "loading", "failed": "crashloop"}[state])

    def route_weights(self) -> dict[str, int]:
        """version -> weight, as the Route says (to + alternateBackends), by the predictor Service names."""
        try:
            route = self.objs.get_namespaced_custom_object("route.openshift.io", "v1", self.ns, "routes", self.name)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        spec = route["spec"]
        backends = [spec["to"], *(spec.get("alternateBackends") or [])]
        by_service = {f"{isvc_name(self.name, v)}-predictor": v for v in (V1, V2)}
        return {by_service[b["name"]]: b.get("weight", 100) for b in backends if b.get("weight", 100) > 0}

    # -- waiting ----------------------------------------------------------------------------------------------------
    def wait(self, pred: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
        return eventually(pred, timeout, what, interval=0.2, ignoring=(KeyError, TypeError, IndexError, ApiException),
                          context=lambda: "operator log tail:\n" + "\n".join(self.operator_log().splitlines()[-40:]))

    def wait_phase(self, *phases: str, timeout: float = 90.0) -> dict[str, Any]:
        return self.wait(lambda: self.promotion().get("phase") in phases and self.promotion(),
                         f"phase in {phases}", timeout)

    def snapshot(self, label: str, health: str) -> None:
        """Record the live object for the Argo CD health-check tests (only with ARBITER_RECORD_SNAPSHOTS=1)."""
        if os.environ.get("ARBITER_RECORD_SNAPSHOTS") != "1":
            return
        obj = copy.deepcopy(self.dm())
        meta = obj["metadata"]
        obj["metadata"] = {k: meta[k] for k in ("name", "namespace", "generation") if k in meta}
        SNAPSHOTS.mkdir(exist_ok=True)
        (SNAPSHOTS / f"{label}.json").write_text(json.dumps({"health": health, "object": obj}, indent=1) + "\n")


def e2e_fixture(kind: type[E2E] = E2E):  # type: ignore[no-untyped-def]
    """A module's `e2e` fixture: a `kind` (E2E or a kit built on it) in the test's namespace with the real operator
    started, closed after the test (the module also defines `stack`, e.g. `stack = module_stack()`)."""
    import pytest

    @pytest.fixture
    def e2e(control_plane, namespace, stack, tmp_path, s3_server):  # type: ignore[no-untyped-def]
        env = kind(control_plane, namespace, stack, tmp_path, s3_server)
        env.start_operator()
        try:
            yield env
        finally:
            env.close()

    return e2e
