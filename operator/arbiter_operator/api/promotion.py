"""`spec.promote` and `status.promotion`: the API of hot version switching.

Owned by the promotion state machine (arbiter_operator.promotion); api/models.py embeds these classes. Field names are
the JSON names (camelCase) so the generated CRD and the Python code read the same.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PromotionPhase = Literal[
    "Idle",  # nothing to do: spec.promote's version is stable and alone
    "Deploying",  # the candidate's InferenceService is being created
    "Waiting",  # waiting for the candidate to become ready (no traffic yet)
    "Shadowing",  # the candidate is warm and gets a mirrored sample of the stable's traffic, no live traffic
    "Progressing",  # canary step `step` holds `weight`% of traffic, analysed at the end of its hold
    "Paused",  # every analysis passed; waiting for the arbiter.dev/approve annotation before full traffic
    "Promoted",  # reserved: a success goes straight to Cooling (or Idle with rollbackWindowSeconds=0)
    "Cooling",  # previous stable kept warm for the rollback window
    "RollingBack",  # traffic back on stable, candidate being stopped
    "Failed",  # rolled back; waits for a spec change or a retry
    "Aborted",  # the user pointed spec.promote back at the stable version; candidate being stopped
]
# A promotion under way (a candidate exists and may still take traffic) / on its way out.
IN_PROGRESS: tuple[PromotionPhase, ...] = ("Deploying", "Waiting", "Shadowing", "Progressing", "Paused")
STOPPING: tuple[PromotionPhase, ...] = ("RollingBack", "Aborted")

# Pending: the evidence does not decide yet (a Sequential step before its maximum hold); at the end of a hold, evidence
# that still does not decide is NoData (too little traffic), which never passes a step.
AnalysisVerdict = Literal["Pass", "Fail", "NoData", "Inconclusive", "Pending"]
# Pending: judged, but too few decisions (on either version) or a difference within noise: the gate holds the step.
CheckVerdict = Literal["Pass", "Fail", "NoData", "Pending"]
AnalysisMode = Literal["Windowed", "Sequential"]
PromotionOutcome = Literal["Succeeded", "RolledBack", "Aborted"]

# Defaults of the decision bounds when neither spec.promote.analysis nor the version's metadata.sla sets one (the
# promotion analysis judges a candidate by them; the model's alerts judge a serving version by them).
DEFAULT_MAX_FALLBACK_RATE = 0.05
DEFAULT_MAX_SCHEMA_VIOLATION_RATE = 0.01
DEFAULT_MAX_LOW_CONFIDENCE_RATE = 0.25
DEFAULT_MAX_DECISION_MIX_SHIFT = 0.10
# The most schema violations one decision can count: one per attempt, and the rendered decision.json leaves the
# runtime's upstream.maxRetries at its default 2 (tests/unit/operator/promotion checks the two agree).
MAX_VIOLATIONS_PER_DECISION = 3


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CanaryStep(_Model):
    weight: int = Field(ge=1, le=99, description="Percent of traffic sent to the candidate during this step.")
    holdSeconds: int = Field(
        300, ge=0, le=86400, description="How long the step holds before its analysis decides (seconds)."
    )


CHECK_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class MetricCheck(_Model):
    """A custom gate: a PromQL query whose single number must stay on the right side of `bound`."""

    name: str = Field(min_length=1, max_length=63, pattern=CHECK_NAME, description="Shown in status and events.")
    query: str = Field(
        min_length=1,
        max_length=4000,
        description="PromQL returning one number. Placeholders: {{candidate}} and {{stable}} expand to the label "
        "selector of the candidate's and the stable version's pods (without braces), {{window}} to the analysis "
        "window (e.g. 60s), {{namespace}}, {{model}}, {{candidateVersion}} and {{stableVersion}} to plain values.",
    )
    bound: float = Field(description="The limit the number is judged against.")
    direction: Literal["max", "min"] = Field(
        "max", description="max: the value must not exceed bound; min: it must not fall below it."
    )


class FallbackReasonBounds(_Model):
    """Bounds on the share of decisions handed to the rules for one reason (the runtime's fallback reasons)."""

    upstream_down: float | None = Field(None, ge=0, le=1, description="vLLM not answering.")
    upstream_error: float | None = Field(None, ge=0, le=1, description="vLLM answering with an error.")
    deadline: float | None = Field(None, ge=0, le=1, description="No valid answer within the decision deadline.")
    invalid: float | None = Field(None, ge=0, le=1, description="Answers that failed the schema or consistency checks.")
    low_confidence: float | None = Field(None, ge=0, le=1, description="Confidence under the threshold.")


class EffectSizes(_Model):
    """Sequential mode: the largest regression against the stable version each gate tolerates. A regression larger
    than this, once the evidence shows it, rolls the candidate back; evidence of none passes the step early."""

    slowDecisionRate: float = Field(
        0.005, gt=0, le=1,
        description="The p95LatencyMs gate: extra share of decisions slower than the p95 bound (0.005: one more in "
        "two hundred).",
    )
    errorRate: float = Field(0.005, gt=0, le=1, description="Extra share of failed decisions.")
    fallbackRate: float = Field(
        0.005, gt=0, le=1, description="Extra share of decisions handed to the fallback rules (also per reason)."
    )
    lowConfidenceRate: float = Field(0.03, gt=0, le=1, description="Extra share of low-confidence decisions.")
    schemaViolationRate: float = Field(
        0.01, gt=0, le=MAX_VIOLATIONS_PER_DECISION, description="Extra rejected model answers per decision."
    )
    decisionMixShift: float = Field(
        0.03, gt=0, le=1, description="Largest move of any label's share of decisions, either way."
    )


class SequentialAnalysis(_Model):
    """Sequential mode: every gate judged continuously on the counts since its step started, by an always-valid test
    (docs/operations.md, "Sequential analysis")."""

    falseRollbackRate: float = Field(
        0.05, ge=0.0001, le=0.2,
        description="Alpha: the highest probability that a promotion rolls back a candidate that regresses no gate by "
        "more than its effect size, over all its steps and gates and any number of looks.",
    )
    lookSeconds: int = Field(
        3, ge=1, le=300, description="How often the evidence is looked at (any number of looks spends the same alpha)."
    )
    effectSizes: EffectSizes = Field(default_factory=EffectSizes)


class Analysis(_Model):
    mode: AnalysisMode = Field(
        "Windowed",
        description="Windowed: each gate judged on the last intervalSeconds, a step passing at the end of its hold. "
        "Sequential: each gate judged on everything since its step started with a declared false-rollback rate; a "
        "regression rolls back as soon as the evidence shows it, and a step passes as soon as the evidence shows none "
        "(its holdSeconds is then the longest it holds).",
    )
    sequential: SequentialAnalysis | None = Field(
        None, description="Sequential mode's settings (the defaults apply when unset)."
    )
    intervalSeconds: int = Field(
        60, ge=5, le=3600, description="Length of the metrics window read from Prometheus at the end of each step."
    )
    p95LatencyMs: float | None = Field(
        None, gt=0, description="p95 decision latency bound in ms; defaults to the candidate version's SLA."
    )
    maxErrorRate: float = Field(0.01, ge=0, le=1, description="Highest tolerated share of failed decisions (0..1).")
    minRequests: int = Field(
        50, ge=0, description="Fewest requests a step must see before its numbers count (a gate comparing with the "
        "stable version needs them from both)."
    )
    insufficientTraffic: Literal["Wait", "Fail"] = Field(
        "Wait", description="When the hold ends without enough evidence (fewer than minRequests, or a difference "
        "within noise): Wait (hold the step until the evidence suffices, up to the progress deadline) or Fail."
    )
    maxFallbackRate: float | None = Field(
        None, ge=0, le=1,
        description="Highest share of decisions handed to the fallback rules (0..1); defaults to the candidate "
        "version's metadata.sla.maxFallbackRate, else 0.05.",
    )
    maxFallbackRateByReason: FallbackReasonBounds | None = Field(
        None, description="Optional bound per fallback reason (share of all decisions, 0..1); unset reasons are "
        "bounded only by maxFallbackRate.",
    )
    maxSchemaViolationRate: float | None = Field(
        None, ge=0,
        description="Highest number of rejected model answers (schema violations and inconsistent trajectories) per "
        "decision; defaults to the candidate version's metadata.sla.maxSchemaViolationRate, else 0.01.",
    )
    maxLowConfidenceRate: float | None = Field(
        None, ge=0, le=1,
        description="Highest share of decisions whose confidence is under the threshold (flagged or handed to the "
        "rules); defaults to the candidate version's metadata.sla.maxLowConfidenceRate, else 0.25.",
    )
    maxDecisionMixShift: float | None = Field(
        None, ge=0, le=1,
        description="Highest absolute difference, over all labels, between the share of decisions with that label "
        "from the candidate and from the stable version in the same window (0..1); default 0.10. Until the stable "
        "version saw minRequests decisions too, it holds the step.",
    )
    maxQueueTimeP95Ms: float | None = Field(
        None, gt=0, description="Optional bound on vLLM's p95 request queue time (ms); off when unset."
    )
    maxKvCacheUsage: float | None = Field(
        None, gt=0, le=1, description="Optional bound on vLLM's peak KV-cache use in the window (0..1); off when unset."
    )
    checks: list[MetricCheck] = Field(
        default_factory=list, max_length=20, description="Custom PromQL gates, judged with the built-in ones."
    )
    failureLimit: int = Field(
        0, ge=0, le=10,
        description="Failed analyses in a row tolerated before the promotion rolls back (0: the first one does).",
    )

    @field_validator("checks")
    @classmethod
    def _unique_names(cls, checks: list[MetricCheck]) -> list[MetricCheck]:
        names = [c.name for c in checks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"analysis.checks names must be unique, repeated: {dup}")
        return checks

    @model_validator(mode="after")
    def _mode_settings(self) -> Analysis:
        # The same rules as the CRD's (api/models.py EXTRA_VALIDATIONS), for objects decoded without the apiserver.
        if self.sequential is not None and self.mode != "Sequential":
            raise ValueError(SEQUENTIAL_NEEDS_MODE)
        if self.mode == "Sequential" and self.failureLimit:
            raise ValueError(SEQUENTIAL_FAILURE_LIMIT)
        return self

    def sequential_settings(self) -> SequentialAnalysis:
        return self.sequential or SequentialAnalysis()


SEQUENTIAL_NEEDS_MODE = (
    "spec.promote.analysis.sequential is read only with analysis.mode: Sequential (set the mode, or remove the block)"
)
SEQUENTIAL_FAILURE_LIMIT = (
    "spec.promote.analysis.failureLimit must be 0 with analysis.mode: Sequential: a sequential gate fails on all the "
    "evidence since its step began, which the next look still holds, so a tolerated failure would only delay the "
    "rollback"
)


class Shadow(_Model):
    """Champion/challenger: the stable version mirrors a sample of its live requests to the candidate."""

    sampleRate: float = Field(0.1, gt=0, le=1, description="Share of the stable's requests mirrored (0..1].")
    holdSeconds: int = Field(600, ge=0, le=7 * 86400, description="How long the shadow phase lasts at least.")
    minAgreement: float = Field(
        0.95, ge=0, le=1, description="Lowest share of mirrored requests where both versions chose the same label."
    )
    minCompared: int = Field(100, ge=1, description="Fewest compared requests before agreement counts.")
    timeoutMs: int = Field(2000, ge=10, le=600000, description="How long the stable waits for a mirrored answer.")
    maxInFlight: int = Field(16, ge=1, le=1024, description="Mirrored requests in flight at most; more are dropped.")

class PromoteSpec(_Model):
    version: str = Field(description="The version that should be active; must be one of spec.versions[].name.")
    strategy: Literal["Immediate", "Canary", "Shadow"] = Field(
        "Immediate",
        description="Immediate: switch once the candidate is ready. Canary: move traffic by steps. Shadow: the "
        "candidate only sees a mirrored sample of the stable's traffic and is judged on agreement, then switched.",
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
    shadow: Shadow | None = Field(
        None,
        description="Shadow phase settings. With strategy Shadow the defaults apply when unset; with strategy Canary "
        "a shadow phase runs before the first step when set.",
    )
    approval: Literal["Auto", "Required"] = Field(
        "Auto",
        description="Required: after every analysis passed, wait (phase Paused) for the arbiter.dev/approve "
        "annotation naming the candidate (kubectl arbiter approve) before it takes all traffic.",
    )

    @field_validator("steps")
    @classmethod
    def _weights_increase(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        weights = [s.weight for s in steps]
        if any(b <= a for a, b in itertools.pairwise(weights)):
            raise ValueError(f"canary step weights must strictly increase, got {weights}")
        return steps


class GateEvidence(_Model):
    """Sequential mode: what one gate's always-valid test has seen: status explains its verdict and when one comes."""

    estimate: float | None = Field(None, description="The statistic: candidate minus stable (agreement: itself).")
    lower: float | None = Field(None, description="Lower end of its always-valid interval.")
    upper: float | None = Field(None, description="Upper end of its always-valid interval.")
    tolerated: float = Field(description="The regression the gate tolerates (its effect size; agreement: its floor).")
    alpha: float = Field(ge=0, le=1, description="The gate's share of falseRollbackRate in this step.")
    decisions: float = Field(ge=0, description="Candidate decisions (or comparisons) counted since the step started.")
    stableDecisions: float | None = Field(None, ge=0, description="The stable version's, in the same time.")
    decisionsNeeded: float | None = Field(
        None, ge=0, description="Candidate decisions a verdict needs at the rates seen so far; unset: none expected "
        "(the difference is about the tolerated one)."
    )
    secondsToVerdict: float | None = Field(
        None, ge=0, description="Expected seconds to that verdict at the current traffic; unset: unknown."
    )


class CheckResult(_Model):
    """One gate of an analysis: what was measured, against which bound, and the verdict."""

    name: str
    value: float | None = None
    bound: float | None = None
    direction: Literal["max", "min"] = "max"
    verdict: CheckVerdict
    message: str = ""
    evidence: GateEvidence | None = None


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
    mode: AnalysisMode | None = None
    checks: list[CheckResult] = Field(default_factory=list, max_length=64)
    message: str = ""


class PromotionRecord(_Model):
    version: str
    fromVersion: str | None = None
    outcome: PromotionOutcome
    reason: str = ""
    startedAt: str
    finishedAt: str
    durationSeconds: float = Field(ge=0)
    count: int | None = Field(
        None, ge=1,
        description="Superseded attempts this record counts (reason Superseded): version and finishedAt are the last "
        "one's, startedAt the first one's, durationSeconds their sum.",
    )
    requestedBy: str | None = Field(
        None, max_length=128,
        description="Who asked for this promotion: the field manager that last wrote spec.promote.version when it "
        "started (metadata.managedFields: e.g. argocd-controller, kubectl-client-side-apply, kubectl-arbiter).",
    )
    revision: str | None = Field(
        None, max_length=256,
        description="The Git revision Argo CD synced when the promotion started, for a DecisionModel Argo CD tracks.",
    )
    generation: int | None = Field(
        None, ge=0, description="metadata.generation of the spec that asked for this promotion.")


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
    approveToken: str | None = Field(
        None, description="Value of the arbiter.dev/approve annotation when the promotion started (not an approval)."
    )
    consecutiveFailures: int = Field(0, ge=0, description="Failed analyses in a row, tolerated up to failureLimit.")
    requestedBy: str | None = Field(
        None, max_length=128,
        description="The field manager that last wrote spec.promote.version when this promotion started.",
    )
    requestedRevision: str | None = Field(
        None, max_length=256, description="The Git revision Argo CD synced when this promotion started, if tracked.")
    requestedGeneration: int | None = Field(
        None, ge=0, description="metadata.generation of the spec that started this promotion.")
    history: list[PromotionRecord] = Field(
        default_factory=list, max_length=11,
        description="The last 10 real outcomes, and one record counting the attempts superseded before they finished.",
    )




def approves(annotation: str | None, candidate: str | None, consumed: str | None) -> bool:
    """Whether the annotation value approves `candidate`: it names it and was set after the promotion started."""
    if not annotation or candidate is None or annotation == consumed:
        return False
    return annotation == candidate or annotation.startswith(candidate + "@")
