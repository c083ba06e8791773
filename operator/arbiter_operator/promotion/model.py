"""What `advance` reads and returns: the observations and inputs of one reconcile, and the plan it makes (data only).

The planner builds `PromotionInputs` from the object and what the observe layer saw, and applies the
`PromotionPlan`: the versions that must run, where traffic goes, the conditions and Events, and when to look again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from arbiter_operator.api.conditions import Condition
from arbiter_operator.api.conditions import Event as PromotionEvent  # one Event type for planner and machine
from arbiter_operator.api.promotion import AnalysisRun, PromoteSpec, PromotionStatus

# Failure reasons (status.promotion.failureReason, and the reason of Promoted/Stalled/Ready).
ANALYSIS_FAILED = "AnalysisFailed"
SHADOW_FAILED = "ShadowAnalysisFailed"
DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
CANDIDATE_FAILED = "CandidateFailed"
ARTIFACTS_INVALID = "ArtifactsInvalid"
ABORTED = "Aborted"
UNKNOWN_VERSION = "UnknownVersion"


@dataclass(frozen=True)
class VersionObservation:
    """What the observe layer saw of one version's InferenceService."""

    exists: bool = False
    ready: bool = False
    failed: bool = False  # KServe reports a terminal failure (e.g. crash loop, image pull, OOM)
    message: str = ""
    # A transient cause (plan/signals.py: a webhook unreachable, the apiserver timing out, a full quota) the version
    # waits on: its reason. Never a failure; the progress deadline bounds the wait.
    held: str = ""
    artifacts_valid: bool | None = True  # None: not checked yet; the ISVC is not created before it is known valid


@dataclass(frozen=True)
class PromotionRequest:
    """Who asked for what spec.promote says now (observe/requester.py): the field manager that last wrote
    spec.promote.version, and the Git revision Argo CD synced, when the object is Argo CD's. None where unknown."""

    by: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class PromotionHold:
    """Something outside the promotion that keeps its candidate from taking traffic (a required audit not ready): it
    stays warm in Waiting (or at the step it is in) until the hold clears; no deadline counts it as a failure.
    stalled: a person must act (Stalled=True); otherwise it clears by itself (Reconciling=True)."""

    reason: str
    message: str
    stalled: bool


@dataclass(frozen=True)
class PromotionInputs:
    spec: PromoteSpec
    status: PromotionStatus | None
    versions: tuple[str, ...]  # spec.versions[].name
    observations: Mapping[str, VersionObservation]
    candidate_sla_p95_ms: float | None  # SLA of spec.promote.version (default p95 bound)
    analysis: AnalysisRun | None  # the result of analysis_due's query, when one ran for this reconcile
    retry_annotation: str | None
    generation: int
    now: datetime
    abort_annotation: str | None = None
    approve_annotation: str | None = None
    # Read only for a pass that starts a promotion (the planner plans again with it); None: not read (yet).
    request: PromotionRequest | None = None
    hold: PromotionHold | None = None
    # Versions a context is pinned to (spec.routing.contexts): kept live (warm) whatever the promotion does, never
    # given Route traffic by it; deployed once their artifacts are known valid.
    pinned: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ShadowPlan:
    """The stable version mirrors a sample of its traffic to the candidate (rendered as the stable's shadow.json)."""

    stable: str
    candidate: str
    sample_rate: float
    timeout_ms: int
    max_in_flight: int


@dataclass(frozen=True)
class ReadyVerdict:
    """What the Ready condition should say as far as promotion is concerned (the planner may add other reasons)."""

    status: Literal["True", "False"]
    reason: str
    message: str


@dataclass(frozen=True)
class PromotionPlan:
    status: PromotionStatus
    live: frozenset[str]
    traffic: Mapping[str, int]
    promoted: Condition
    stalled: Condition
    reconciling: Condition
    ready: ReadyVerdict
    events: tuple[PromotionEvent, ...]
    requeue_after: float | None
    shadow: ShadowPlan | None = None
