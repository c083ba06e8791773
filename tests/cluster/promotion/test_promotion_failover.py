"""Two operator replicas with leader election on the promotion e2e stack (real cluster, real Prometheus): the leader
is SIGKILLed in the middle of a canary, the standby takes the Lease and finishes the promotion from status, and its
metrics page counts the promotion's outcome."""

from __future__ import annotations

import re
import time

import pytest
from arbiter_devenv.operator_process import OperatorProcess
from prometheus_client.parser import text_string_to_metric_families
from support.e2e_kit import E2E, V1, V2, fast_canary
from support.promstack import module_stack

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
]


stack = module_stack()


def _replica(e: E2E, tmp_path, name: str) -> OperatorProcess:
    return OperatorProcess(
        e.cp.kubeconfig, [e.ns], log_dir=tmp_path / name, metrics=True,
        env={"ARBITER_PROMETHEUS_URL": e.stack.url, "ARBITER_RESYNC_SECONDS": "30"},
        extra_args=("--leader-elect", "--leader-election-namespace", e.ns),
    ).start()


def _identity(op: OperatorProcess) -> str:
    return re.search(r"leader election on: Lease \S+, identity (\S+)", op.log()).group(1)


def _promotions(op: OperatorProcess, outcome: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(op.scrape()) for s in f.samples
               if s.name == "arbiter_operator_promotions_total" and s.labels.get("outcome") == outcome)


def test_standby_finishes_a_canary_after_the_leader_is_killed(control_plane, namespace, stack, tmp_path, s3_server):
    e = E2E(control_plane, namespace, stack, tmp_path, s3_server)
    first = _replica(e, tmp_path, "a")
    second = None
    try:
        e.wait(lambda: "acquired the leader Lease" in first.log(), "the first replica leads", timeout=30)
        second = _replica(e, tmp_path, "b")
        second_id = _identity(second)

        e.create(V1, **fast_canary(steps=[{"weight": 10, "holdSeconds": 20}, {"weight": 50, "holdSeconds": 6}]))
        e.set_state(V1, "ready")
        e.wait(lambda: e.route_weights() == {V1: 100}, "Route 100% on 1.0.0", timeout=120)
        e.patch_promote(version=V2)
        e.wait(lambda: V2 in e.isvcs(), "candidate InferenceService")
        e.set_state(V2, "ready")
        # The Route is written before the status that records the step (children first, then status), so the
        # phase is awaited with the weights rather than read in the instant between the two writes.
        e.wait(lambda: e.route_weights() == {V1: 90, V2: 10} and e.promotion().get("phase") == "Progressing",
               "step 1: 10% on the candidate, phase Progressing", timeout=60)
        assert e.promotion()["phase"] == "Progressing"
        assert not second.writes(), "the standby wrote"

        first.kill()  # mid-canary, holding the Lease
        killed = time.monotonic()
        e.wait(lambda: "acquired the leader Lease" in second.log(), "the standby takes over", timeout=40)
        print(f"\ntakeover after SIGKILL of the leader mid-canary: {time.monotonic() - killed:.1f}s")

        e.wait(lambda: e.route_weights() == {V2: 100}, "the new leader finishes the canary", timeout=120)
        p = e.wait_phase("Cooling", timeout=60)
        rec = p["history"][-1]
        assert (p["stable"], rec["version"], rec["fromVersion"], rec["outcome"]) == (V2, V2, V1, "Succeeded")
        # The new leader recorded the outcome; nothing was written by it before it held the Lease.
        e.wait(lambda: _promotions(second, "Succeeded") == 1, "promotions_total{outcome=Succeeded} on the new leader")
        log = second.log()
        assert log.index("acquired the leader Lease") < log.index(" kube-write "), second_id
    finally:
        first.stop()
        if second is not None:
            second.stop()
        e.close()
