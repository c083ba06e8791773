"""Why a version's predictor is not serving, read from what Kubernetes says about its pods and Deployment (pure).

KServe's InferenceService status says *that* a predictor is not ready; the pods say *why*: the scheduler's
``PodScheduled=False/Unschedulable`` message (not enough GPUs on any node, no node with the GPU product), or a
serving container in ``CrashLoopBackOff`` with its restart count and last termination reason (``OOMKilled``,
``Error``). SREs get that cause on the DecisionModel instead of "not ready".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

UNSCHEDULABLE = "Unschedulable"
CRASH_LOOP = "CrashLoopBackOff"
# Past this many restarts a loading predictor is not going to come up by itself: the version counts as failed.
FAILED_AFTER_RESTARTS = 3


@dataclass(frozen=True)
class PredictorProblem:
    reason: str  # UNSCHEDULABLE | CRASH_LOOP
    message: str
    failed: bool = False  # will not recover without a change (the promotion machine may roll back)


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def predictor_problem(pods: Iterable[Mapping[str, Any]]) -> PredictorProblem | None:
    """The first reason the pods of one InferenceService do not serve, or None when the pods show none (still
    starting, or ready)."""
    pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
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
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            restarts = int(cs.get("restartCount") or 0)
            if waiting.get("reason") == CRASH_LOOP or (restarts and last and not cs.get("ready")):
                why = last.get("reason") or "Error"
                code = last.get("exitCode")
                exit_note = f" (exit code {code})" if code is not None else ""
                return PredictorProblem(
                    CRASH_LOOP,
                    f"pod {_name(pod)}: container {cs.get('name')} restarted {restarts} time(s), last exit "
                    f"{why}{exit_note}; see `oc logs --previous {_name(pod)} -c {cs.get('name')}`",
                    failed=restarts >= FAILED_AFTER_RESTARTS,
                )
    return None


def deployment_available(deployment: Mapping[str, Any] | None) -> bool:
    """The predictor Deployment has at least one available replica of its current generation's rollout."""
    if not deployment:
        return False
    status = deployment.get("status") or {}
    available = next((c for c in status.get("conditions") or [] if c.get("type") == "Available"), None)
    return bool(available and available.get("status") == "True" and int(status.get("availableReplicas") or 0) > 0)
