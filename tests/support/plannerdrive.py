"""Drive the operator's real planner (plan.plan) through a promotion without a cluster, to get whole-status
snapshots for the Argo CD health check. The "cluster" here is a dict of InferenceServices whose readiness the test
sets the way KServe's status reports it; what the planner wants created/deleted is applied to it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from arbiter_operator.api.models import DecisionModel
from arbiter_operator.api.promotion import AnalysisRun
from arbiter_operator.plan import Observations, Plan, children_of, plan
from arbiter_operator.promotion import analysis_due, judge

from support.examples import example
from support.paths import REPO

ROOT = REPO
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def two_versions(promote: str = "1.0.0", **promote_fields: Any) -> dict[str, Any]:
    body = example()
    v2 = copy.deepcopy(body["spec"]["versions"][0])
    v2["name"] = "1.1.0"
    v2["storageUri"] = v2["storageUri"].replace("1.0.0", "1.1.0")
    body["spec"]["versions"].append(v2)
    body["spec"]["promote"] = {"version": promote, **promote_fields}
    body["metadata"].update(namespace="team", uid="uid-1", generation=1)
    return body


def isvc_status(ready: bool) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Loading"}]}


def same_mix(answered: float) -> dict[str, dict[str, float]]:
    """The decision mix of a candidate that decides like the stable version (the mix gate compares the two; without
    both it holds the step): the same label shares on each, the stable version serving nine times as much."""
    mix = {"approve": 0.6 * max(0.0, answered), "decline": 0.4 * max(0.0, answered)}
    return {"labels": mix, "stable_labels": {k: 9 * v for k, v in mix.items()}}


class Driver:
    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.isvcs: dict[str, dict[str, Any]] = {}
        self.now = T0
        self.snapshot: dict[str, Any] = {}
        self.events: list[Any] = []  # every Event the planner asked for, in order
        self.last: Plan | None = None  # the latest pass's plan

    def dm(self) -> DecisionModel:
        return DecisionModel.model_validate(self.body)

    def set_ready(self, version: str, ready: bool = True) -> None:
        for isvc in self.isvcs.values():
            if isvc["metadata"]["labels"].get("arbiter.dev/version") == version:
                isvc["status"] = isvc_status(ready)

    def edit_spec(self, **promote: Any) -> None:
        self.body["spec"]["promote"].update(promote)
        self.body["metadata"]["generation"] += 1

    def analysis(self, p95_s: float, errors: float, requests: float) -> AnalysisRun | None:
        dm = self.dm()
        q = analysis_due(dm.spec.promote, dm.status.promotion, self.now, namespace="team", model=dm.metadata.name,
                         sla_p95_ms=150)
        if q is None:
            return None
        return judge(q, {"requests": requests, "errors": errors, "decision_p95": p95_s, "vllm_p95": None,
                         **same_mix(requests - errors)})

    def observations(self, analysis: AnalysisRun | None) -> Observations:
        """What the operator observed this pass; a test that observes more (workloads, a runtime image) extends it."""
        return Observations(children=children_of(InferenceService=copy.deepcopy(self.isvcs)), analysis=analysis)

    def reconcile(self, after: float = 0, analysis: AnalysisRun | None = None) -> dict[str, Any]:
        """One pass: plan on what is observed, apply the InferenceServices it wants to the "cluster"; ``self.last`` is
        the plan, the DecisionModel after it is returned."""
        self.now += timedelta(seconds=after)
        self.last = p = plan(self.dm(), self.observations(analysis), self.now)
        self.events.extend(p.events)
        for child in p.children or []:
            if child["kind"] == "InferenceService":
                name = child["metadata"]["name"]
                kept = self.isvcs.get(name, {}).get("status") or isvc_status(False)
                self.isvcs[name] = {**copy.deepcopy(child), "status": kept}
        for _, kind, name in p.deletions:
            if kind == "InferenceService":
                self.isvcs.pop(name, None)
        self.body["status"] = p.status
        self.snapshot = copy.deepcopy(self.body)
        return self.snapshot


def candidate_ready(**promote: Any) -> Driver:
    """1.0.0 deployed, ready and stable under these spec.promote fields; then spec.promote points at 1.1.0, whose
    predictor becomes ready, and one more reconcile has run (``d.snapshot`` is the DecisionModel after it)."""
    d = Driver(two_versions("1.0.0", **promote))
    d.reconcile()
    d.set_ready("1.0.0")
    d.reconcile(5)
    d.edit_spec(version="1.1.0")
    d.reconcile(1)
    d.set_ready("1.1.0")
    d.reconcile(1)
    return d


def failing_canary() -> tuple[Driver, dict[str, Any]]:
    """1.0.0 stable; the canary of 1.1.0 at 10% fails its first analysis (p95 400 ms). Returns the driver and the
    DecisionModel right after the failing analysis; one more ``reconcile(1)`` finishes the rollback."""
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}],
                        analysis={"intervalSeconds": 30, "minRequests": 50})
    d.now += timedelta(seconds=30)
    return d, d.reconcile(0, d.analysis(0.4, 0, 500))
