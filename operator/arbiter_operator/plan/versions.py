"""What a pass sees of each version (pure): KServe's verdict on its InferenceService, read together with its predictor
Deployment and pods, as the promotion machine's `VersionObservation`s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.models import DecisionModel, ModelVersion, isvc_name
from ..promotion.machine import VersionObservation
from ..render.common import LABEL_VERSION
from .model import ArtifactObservation, Observations
from .predictors import (
    PredictorProblem,
    as_map,
    as_maps,
    deployment_available,
    deployment_problem,
    predictor_problem,
)
from .signals import classify_message

# KServe's model transition states that mean "this will not become ready without a change".
FAILED_TRANSITIONS = {"BlockedByFailedLoad", "InvalidSpec"}


@dataclass(frozen=True)
class VersionsSeen:
    """The spec's versions and what was observed of them, before the promotion moves."""

    versions: Mapping[str, ModelVersion]  # spec.versions by name, in spec order
    isvcs: Mapping[str, dict[str, Any]]  # the InferenceService of each version (see `serving_inferenceservices`)
    observations: Mapping[str, VersionObservation]  # every version of the spec or with an InferenceService
    problems: Mapping[str, PredictorProblem]  # why a version's pods do not serve, where they show it

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.versions)


def observe_versions(dm: DecisionModel, obs: Observations) -> VersionsSeen:
    """Each version of the spec, and each that still has an InferenceService, as the promotion machine reads it."""
    versions = {v.name: v for v in dm.spec.versions}
    isvc_by_version = serving_inferenceservices(dm.metadata.name, obs.of_kind("InferenceService"))
    # The versions that served when the last status was written (the stable one, the previous one kept warm).
    before = dm.status.promotion
    serving_before = {v for v in (before.stable, before.previous) if v} if before is not None else set()
    vobs: dict[str, VersionObservation] = {}
    problems: dict[str, PredictorProblem] = {}
    for v in set(versions) | set(isvc_by_version):
        message: str | None
        exists, ready, failed, message = isvc_state(isvc_by_version.get(v))
        held = "" if ready or failed or not message else _held_reason(message)
        if exists and obs.workloads_observed:
            ready, failed, message, problem = _workload_state(
                isvc_name(dm.metadata.name, v), ready, failed, message, obs, serves=v in serving_before)
            if problem is not None:
                problems[v] = problem
                held = problem.reason if problem.transient and not failed else held
        art = obs.artifacts.get(v, ArtifactObservation())
        vobs[v] = VersionObservation(
            exists=exists, ready=ready, failed=failed, message=message, artifacts_valid=art.valid, held=held
        )
    return VersionsSeen(versions, isvc_by_version, vobs, problems)


def serving_inferenceservices(dm_name: str, owned: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per version (by its label): the InferenceService named isvc_name() for it. `owned` holds only this
    DecisionModel's children; one under another name speaks for no version (and is deleted as not wanted)."""
    objs: dict[str, dict[str, Any]] = {}
    for name, isvc in sorted(owned.items()):
        version = ((isvc.get("metadata") or {}).get("labels") or {}).get(LABEL_VERSION)
        if version and name == isvc_name(dm_name, version):
            objs[version] = isvc
    return objs


def isvc_state(isvc: dict[str, Any] | None) -> tuple[bool, bool, bool, str]:
    """(exists, ready, failed, message) from an InferenceService's KServe status."""
    if isvc is None:
        return False, False, False, ""
    # Read as any shape: the status is KServe's (or anybody's) to write, and a field of the wrong type means "not
    # said", never an exception in the reconcile or in the watch handler that judges the event.
    status = as_map(isvc.get("status"))
    ready_cond = next((x for x in as_maps(status.get("conditions")) if x.get("type") == "Ready"), None)
    ready = bool(ready_cond and ready_cond.get("status") == "True")
    model_status = as_map(status.get("modelStatus"))
    transition = model_status.get("transitionStatus")
    failed = isinstance(transition, str) and transition in FAILED_TRANSITIONS
    message: Any = ""
    if failed:
        info = as_map(model_status.get("lastFailureInfo"))
        message = info.get("message") or info.get("reason") or transition
        # KServe records what it met, outages included: a failure that is one (plan/signals.py) only holds.
        failed = not classify_message(str(message), "Failed").transient
    elif ready_cond and not ready:
        message = ready_cond.get("message") or ready_cond.get("reason") or ""
    return True, ready, failed, message if isinstance(message, str) else str(message)


def _held_reason(message: str) -> str:
    """The transient reason KServe's own message shows (its webhook or the apiserver out), else none."""
    verdict = classify_message(message, "")
    return verdict.reason if verdict.transient else ""


def _workload_state(
    name: str, ready: bool, failed: bool, message: str, obs: Observations, serves: bool = False
) -> tuple[bool, bool, str, PredictorProblem | None]:
    """A version is ready when KServe says so and its predictor Deployment has an available replica (of its latest
    spec, unless the version already serves: then a scale or rollout in progress takes nothing away); when it is not,
    the pods say why (unschedulable, crash loop)."""
    if ready and not deployment_available(obs.predictor_deployments.get(name), current_spec=not serves):
        ready = False
        message = f"predictor Deployment {name}-predictor has no available replica"
    if ready:
        return ready, failed, message, None
    problem = deployment_problem(obs.predictor_deployments.get(name)) or predictor_problem(
        obs.predictor_pods.get(name, ()))
    if problem is None:
        return ready, failed, message, None
    return ready, failed or problem.failed, problem.message, problem
