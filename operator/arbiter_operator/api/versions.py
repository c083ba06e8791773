"""What a DecisionModel decides with: the model (spec.model), its decision settings (spec.decision, and a version's
overrides of them), and its versions (spec.versions[]) with their governance metadata."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .fields import JsonSchemaObject, Label, LongStr, Name, ShortStr, _cel, _checked, _Model, _rules
from .serving import VersionVllm

# ---------------------------------------------------------------- spec.model


class ModelRef(_Model):
    name: Name = Field(description="The model's name in the Model Registry (RegisteredModel name).")
    description: LongStr | None = Field(None, description="Shown in the registry next to the model.")
    architecture: ShortStr | None = Field(
        None,
        description="Expected architecture from config.json (e.g. Qwen3ForCausalLM); checked against the artifacts.",
    )
    format: Literal["safetensors", "gguf"] = Field(
        "safetensors", description="Weights format, recorded on the registry's ModelArtifact."
    )


# ---------------------------------------------------------------- spec.decision


class FallbackRule(_Model):
    name: Label = Field(description="Rule name, reported in audit records when the rule decides.")
    when: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="CEL expression over `input` (the request) and `model` (the model's result, absent when the "
        "model failed); the first rule that is true decides."
    )
    decision: Label = Field(description="The label this rule decides; must be one of decision.labels.")
    reasoningCode: Label = Field(
        description="Reasoning code reported with the decision; one of decision.reasoningCodes."
    )


class DecisionSpec(_Model):
    model_config = _checked(
        _cel(
            "self.lowConfidencePolicy != 'fallback' || size(self.fallbackRules) > 0",
            "decision.lowConfidencePolicy 'fallback' needs at least one entry in decision.fallbackRules",
        ),
        _cel(
            "self.fallbackRules.all(r, r.decision in self.labels)",
            "every decision.fallbackRules[].decision must be one of decision.labels",
        ),
        _cel(
            "self.fallbackRules.all(r, r.reasoningCode in self.reasoningCodes)",
            "every decision.fallbackRules[].reasoningCode must be one of decision.reasoningCodes",
        ),
    )

    labels: list[Label] = Field(
        min_length=2,
        max_length=32,
        description="The decisions the model chooses between, e.g. [approved, rejected, review].",
        json_schema_extra=_rules(
            _cel("self.all(l, self.exists_one(m, m == l))", "decision.labels must be unique")
        ),
    )
    reasoningCodes: list[Label] = Field(
        min_length=1,
        max_length=256,
        description="Reasoning codes the model cites in each trajectory step (it may cite no other).",
        json_schema_extra=_rules(
            _cel("self.all(l, self.exists_one(m, m == l))", "decision.reasoningCodes must be unique")
        ),
    )
    steps: int = Field(1, ge=1, le=16, description="Number of steps in the decision trajectory.")
    trajectoryMode: Literal["scored", "generated"] = Field(
        "scored",
        description="scored: label probabilities read from the model's logprobs per step; generated: the model "
        "writes the trajectory as JSON constrained by the output schema.",
    )
    scoredFormat: Literal["compact", "fused", "lines"] = Field(
        "compact",
        description="What the model writes in scored mode. compact: per step the reasoning code immediately "
        "followed by the label, no separators (2 generated tokens per step with single-token names; codes and "
        "labels must each be prefix-free); fused: the compact text from a model whose tokenizer has every code "
        "immediately followed by every label as one token (1 generated token per step; at most 128 pairs); lines: "
        "one line CODE:LABEL per step (4 tokens per step), for models fine-tuned on that format.",
    )
    confidenceThreshold: float = Field(
        0.7, ge=0, le=1, description="A final decision below this confidence is low-confidence."
    )
    lowConfidencePolicy: Literal["flag", "fallback"] = Field(
        "flag", description="flag: return the decision marked lowConfidence; fallback: let the fallback rules decide."
    )
    deadlineMs: int = Field(
        1000, ge=10, le=600000, description="Per-request deadline; past it the fallback rules decide."
    )
    fallbackRules: list[FallbackRule] = Field(
        default_factory=list,
        max_length=64,
        description="Rules-engine fallback used when the model is down, late or unsure (per lowConfidencePolicy).",
        json_schema_extra=_rules(
            _cel("self.all(r, self.exists_one(s, s.name == r.name))", "decision.fallbackRules names must be unique")
        ),
    )


class DecisionOverride(_Model):
    """Per-version override of spec.decision: any field set here wins for that version."""

    labels: list[Label] | None = Field(None, min_length=2, max_length=32)
    reasoningCodes: list[Label] | None = Field(None, min_length=1, max_length=256)
    steps: int | None = Field(None, ge=1, le=16)
    trajectoryMode: Literal["scored", "generated"] | None = None
    scoredFormat: Literal["compact", "fused", "lines"] | None = None
    confidenceThreshold: float | None = Field(None, ge=0, le=1)
    lowConfidencePolicy: Literal["flag", "fallback"] | None = None
    deadlineMs: int | None = Field(None, ge=10, le=600000)
    fallbackRules: list[FallbackRule] | None = Field(None, max_length=64)


# ---------------------------------------------------------------- spec.versions[]


class Sla(_Model):
    p95LatencyMs: int = Field(ge=1, le=600000, description="p95 decision latency the version promises (ms).")
    # The decision-quality bounds the version promises: the promotion analysis uses them when spec.promote.analysis
    # sets none.
    maxFallbackRate: float | None = Field(
        None, ge=0, le=1, description="Highest share of decisions the fallback rules may make (0..1)."
    )
    maxSchemaViolationRate: float | None = Field(
        None, ge=0, description="Highest number of rejected model answers per decision."
    )
    maxLowConfidenceRate: float | None = Field(
        None, ge=0, le=1, description="Highest share of decisions under the confidence threshold (0..1)."
    )


class TrainingData(_Model):
    model_config = _checked(
        _cel("self.to >= self.from", "trainingData.to must not be before trainingData.from")
    )
    from_: Annotated[str, StringConstraints(max_length=10)] = Field(
        alias="from",
        pattern=r"^\d{4}-\d{2}-\d{2}$",
        description="First day of the training data (YYYY-MM-DD).",
    )
    to: Annotated[str, StringConstraints(max_length=10)] = Field(
        pattern=r"^\d{4}-\d{2}-\d{2}$", description="Last day of the training data (YYYY-MM-DD)."
    )


class VersionMetadata(_Model):
    """Governance metadata, recorded in the Model Registry and enforced by the runtime."""

    inputSchema: JsonSchemaObject = Field(
        description="JSON Schema every request is validated against (nested at most 64 levels deep).")
    outputSchema: JsonSchemaObject = Field(
        description="JSON Schema every trajectory must also pass: the document {\"steps\": [{step, reasoningCode, "
        "label, probabilities, confidence}, ...]}. The operator refuses one that no trajectory of the version's "
        "decision settings can satisfy, and one nested more than 64 levels deep."
    )
    sla: Sla
    trainingData: TrainingData
    biasReportUrl: Annotated[str, StringConstraints(max_length=2048)] = Field(
        pattern=r"^https?://", description="Where the version's bias report lives (http or https URL)."
    )


class ModelVersion(_Model):
    name: Annotated[str, StringConstraints(min_length=1, max_length=40)] = Field(
        pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$",
        description="Version string (lowercase, digits, '.', '-'), e.g. 1.4.0; dots become '-' in child names.",
    )
    storageUri: Annotated[str, StringConstraints(min_length=7, max_length=2048)] = Field(
        description="Where the weights are: s3://bucket/prefix, pvc://claim/path or oci://registry/image:tag.",
        json_schema_extra=_rules(
            _cel(
                "self.matches('^(s3|pvc|oci)://[^/]+')",
                "storageUri must start with s3://, pvc:// or oci:// followed by a bucket, claim or registry",
            )
        ),
    )
    metadata: VersionMetadata
    decision: DecisionOverride | None = Field(None, description="Overrides of spec.decision for this version.")
    vllm: VersionVllm | None = Field(
        None, description="This version's own quantization and KV-cache dtype, overriding spec.serving.vllm: "
        "add a version with the same storageUri and a new setting, and promote it like any new version."
    )


def effective_decision(spec: DecisionSpec, version: ModelVersion) -> DecisionSpec:
    """spec.decision with the version's overrides applied (a field set on the version wins)."""
    if version.decision is None:
        return spec
    override = version.decision.model_dump(exclude_none=True)
    return spec.model_copy(update=override)
