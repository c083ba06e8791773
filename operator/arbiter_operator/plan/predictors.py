"""Why a version's predictor is not serving, read from what Kubernetes says about its pods and Deployment (pure).

KServe's InferenceService status says *that* a predictor is not ready; the pods say *why*: the scheduler's
``PodScheduled=False/Unschedulable`` message (not enough GPUs on any node, no node with the GPU product), or a
serving container in ``CrashLoopBackOff`` with its restart count and last termination reason (``OOMKilled``,
``Error``). SREs get that cause on the DecisionModel instead of "not ready". Whether a cause fails the version or
only holds it is plan/signals.py's one verdict.
"""

from __future__ import annotations

from collections import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .signals import classify_message

UNSCHEDULABLE = "Unschedulable"
CRASH_LOOP = "CrashLoopBackOff"
FAILED_CREATE = "FailedCreate"  # the ReplicaSet cannot create pods and no retry helps (Pod Security, a denial)
IMAGE_PULL = "ImagePullBackOff"  # the serving image cannot be pulled: the candidate's own (a wrong image or tag)
_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
# The kubelet says CrashLoopBackOff once a container has failed and is held back before its next start; a predictor
# in that state, or past this many restarts, is not going to come up by itself: the version counts as failed (the
# promotion machine may roll back).
FAILED_AFTER_RESTARTS = 3


@dataclass(frozen=True)
class PredictorProblem:
    reason: str  # UNSCHEDULABLE | CRASH_LOOP | IMAGE_PULL | FAILED_CREATE | a transient reason of plan/signals.py
    message: str
    failed: bool = False  # will not recover without a change (the promotion machine may roll back)
    transient: bool = False  # an outage outside the version (plan/signals.py): the promotion holds, never fails


def as_map(value: Any) -> Mapping[str, Any]:
    # A decoded object is a dict: checked first, since isinstance against typing.Mapping goes through abc's hooks,
    # and this runs for every watch event.
    return value if isinstance(value, (dict, abc.Mapping)) else {}


def as_maps(value: Any) -> list[Mapping[str, Any]]:
    return [x for x in value if isinstance(x, (dict, abc.Mapping))] if isinstance(value, list) else []


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in as_maps(as_map(pod.get("status")).get("conditions")) if c.get("type") == type_), None)


def _name(pod: Mapping[str, Any]) -> str:
    return str(as_map(pod.get("metadata")).get("name", "?"))


def _int(value: Any) -> int:
    try:
        return int(value) if not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


def predictor_problem(pods: Iterable[Mapping[str, Any]]) -> PredictorProblem | None:
    """The first reason the pods of one InferenceService do not serve, or None when the pods show none (still
    starting, or ready)."""
    # What the apiserver returns is trusted to be a pod, but read defensively: a malformed one is skipped, not fatal.
    pods = [p for p in pods if isinstance(p, Mapping) and not as_map(p.get("metadata")).get("deletionTimestamp")]
    pending = []
    for pod in sorted(pods, key=_name):
        scheduled = _condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == UNSCHEDULABLE:
            pending.append((_name(pod), str(scheduled.get("message") or "")))
    if pending:
        names = ", ".join(n for n, _ in pending)
        return PredictorProblem(
            UNSCHEDULABLE,
            f"{len(pending)} predictor pod(s) cannot be scheduled ({names}): {pending[0][1]}",
        )
    for pod in sorted(pods, key=_name):
        for cs in as_maps(as_map(pod.get("status")).get("containerStatuses")):
            waiting = as_map(as_map(cs.get("state")).get("waiting"))
            last = as_map(as_map(cs.get("lastState")).get("terminated"))
            restarts = _int(cs.get("restartCount"))
            if waiting.get("reason") in _PULL_REASONS:
                return PredictorProblem(
                    IMAGE_PULL,
                    f"pod {_name(pod)}: container {cs.get('name')} image cannot be pulled "
                    f"({waiting.get('reason')}): {waiting.get('message') or ''}",
                    # ErrImagePull is the first try (a registry hiccup heals); BackOff: the kubelet already retried.
                    failed=waiting.get("reason") != "ErrImagePull",
                )
            if waiting.get("reason") == CRASH_LOOP or (restarts and last and not cs.get("ready")):
                why = last.get("reason") or "Error"
                code = last.get("exitCode")
                exit_note = f" (exit code {code})" if code is not None else ""
                return PredictorProblem(
                    CRASH_LOOP,
                    f"pod {_name(pod)}: container {cs.get('name')} restarted {restarts} time(s), last exit "
                    f"{why}{exit_note}; see `oc logs --previous {_name(pod)} -c {cs.get('name')}`",
                    failed=waiting.get("reason") == CRASH_LOOP or restarts >= FAILED_AFTER_RESTARTS,
                )
    return None


def deployment_problem(deployment: Mapping[str, Any] | None) -> PredictorProblem | None:
    """Pods that cannot even be created: the Deployment's ReplicaFailure says why. A refusal (Pod Security, a
    webhook that denied the pod) fails the version; an unreachable webhook, a timeout or a full quota only holds it
    (plan/signals.py)."""
    if not isinstance(deployment, Mapping):
        return None
    failure = next((c for c in as_maps(as_map(deployment.get("status")).get("conditions"))
                    if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)
    if failure is None:
        return None
    message = str(failure.get("message") or "")
    verdict = classify_message(message, FAILED_CREATE)
    return PredictorProblem(verdict.reason, f"predictor pods cannot be created: {message}",
                            failed=not verdict.transient, transient=verdict.transient)


def deployment_available(deployment: Mapping[str, Any] | None, current_spec: bool = True) -> bool:
    """The predictor Deployment has at least one available replica. current_spec: and the Deployment controller has
    seen its latest spec (a version that has still to prove it loaded); a version that already serves keeps serving
    from its available replicas while a spec change (a scale, a rolling update) is being picked up."""
    if not deployment:
        return False
    status = as_map(deployment.get("status"))
    generation = _int(as_map(deployment.get("metadata")).get("generation"))
    if current_spec and generation and _int(status.get("observedGeneration")) < generation:
        return False  # a spec change the Deployment controller has not looked at yet: its replicas are of the old one
    available = next((c for c in as_maps(status.get("conditions")) if c.get("type") == "Available"), None)
    return bool(available and available.get("status") == "True" and _int(status.get("availableReplicas")) > 0)
