"""`spec.promote` and `status.promotion`: the API of hot version switching.

Owned by the promotion state machine (arbiter_operator.promotion); api/models.py embeds these classes. Field names are
the JSON names (camelCase) so the generated CRD and the Python code read the same.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

PromotionPhase = Literal[
    "Idle",  # nothing to do: spec.promote's version is stable and alone
    "Deploying",  # the candidate's InferenceService is being created
    "Waiting",  # waiting for the candidate to become ready (no traffic yet)
    "Progressing",  # canary step `step` holds `weight`% of traffic, analysed at the end of its hold
    "Promoted",  # reserved: a success goes straight to Cooling (or Idle with rollbackWindowSeconds=0)
    "Cooling",  # previous stable kept warm for the rollback window
    "RollingBack",  # traffic back on stable, candidate being stopped
    "Failed",  # rolled back; waits for a spec change or a retry
    "Aborted",  # the user pointed spec.promote back at the stable version; candidate being stopped
]

AnalysisVerdict = Literal["Pass", "Fail", "NoData", "Inconclusive"]
PromotionOutcome = Literal["Succeeded", "RolledBack", "Aborted"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CanaryStep(_Model):
    weight: int = Field(ge=1, le=99, description="Percent of traffic sent to the candidate during this step.")
    holdSeconds: int = Field(
        300, ge=0, le=86400, description="How long the step holds before its analysis decides (seconds)."
    )


class Analysis(_Model):
    intervalSeconds: int = Field(
        60, ge=5, le=3600, description="Length of the metrics window read from Prometheus at the end of each step."
    )
    p95LatencyMs: float | None = Field(
        None, gt=0, description="p95 decision latency bound in ms; defaults to the candidate version's SLA."
    )
    maxErrorRate: float = Field(0.01, ge=0, le=1, description="Highest tolerated share of failed decisions (0..1).")
    minRequests: int = Field(50, ge=0, description="Fewest requests a step must see before its numbers count.")
    insufficientTraffic: Literal["Wait", "Fail"] = Field(
        "Wait", description="With fewer than minRequests: Wait (hold the step, up to the progress deadline) or Fail."
    )


class PromoteSpec(_Model):
    version: str = Field(description="The version that should be active; must be one of spec.versions[].name.")
    strategy: Literal["Immediate", "Canary"] = Field(
        "Immediate", description="Immediate: switch once the candidate is ready. Canary: move traffic by steps."
    )
    steps: list[CanaryStep] = Field(
        default_factory=lambda: [CanaryStep(weight=10), CanaryStep(weight=50)],
        max_length=10,
        description="Canary steps, weights strictly increasing; 100% follows the last step.",
    )
    progressDeadlineSeconds: int = Field(
        1800, ge=30, le=86400, description="A promotion not finished by then is rolled back (seconds)."
    )
    rollbackWindowSeconds: int = Field(
        3600, ge=0, le=7 * 86400, description="How long the previous version stays warm after a success (seconds)."
    )
    analysis: Analysis = Field(default_factory=Analysis)

    @field_validator("steps")
    @classmethod
    def _weights_increase(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        weights = [s.weight for s in steps]
        if any(b <= a for a, b in zip(weights, weights[1:])):
            raise ValueError(f"canary step weights must strictly increase, got {weights}")
        return steps


class AnalysisRun(_Model):
    at: str = Field(description="RFC 3339 time of the query.")
    step: int = Field(ge=-1)
    verdict: AnalysisVerdict
    requests: float | None = None
    p95LatencyMs: float | None = None
    errorRate: float | None = None
    # The bounds the numbers were judged against, so status alone explains a verdict.
    p95BoundMs: float | None = None
    maxErrorRate: float | None = None
    minRequests: int | None = None
    windowSeconds: int | None = None
    message: str = ""


class PromotionRecord(_Model):
    version: str
    fromVersion: str | None = None
    outcome: PromotionOutcome
    reason: str = ""
    startedAt: str
    finishedAt: str
    durationSeconds: float = Field(ge=0)


class PromotionStatus(_Model):
    phase: PromotionPhase = "Idle"
    stable: str | None = Field(None, description="Version that is proven and serves (by default) all traffic.")
    candidate: str | None = Field(None, description="Version being promoted, if any.")
    previous: str | None = Field(None, description="Former stable kept warm during the rollback window.")
    step: int = Field(-1, ge=-1, description="Index of the current canary step; -1 when none.")
    weight: int = Field(0, ge=0, le=100, description="Percent of traffic the candidate receives now.")
    startedAt: str | None = None
    stepStartedAt: str | None = None
    coolingUntil: str | None = None
    lastAnalysis: AnalysisRun | None = None
    failureReason: str | None = None
    failureMessage: str | None = None
    failedVersion: str | None = Field(None, description="Version whose promotion failed (phase Failed).")
    failedGeneration: int | None = Field(
        None, description="metadata.generation when the promotion failed; a newer generation retries it."
    )
    retryToken: str | None = Field(None, description="Last value of the arbiter.dev/retry annotation acted upon.")
    abortToken: str | None = Field(None, description="Last value of the arbiter.dev/abort annotation acted upon.")
    history: list[PromotionRecord] = Field(default_factory=list, max_length=10)


RETRY_ANNOTATION = "arbiter.dev/retry"
# Abort without editing spec (GitOps-safe): a new value rolls a running promotion back; see docs/operations.md.
ABORT_ANNOTATION = "arbiter.dev/abort"
