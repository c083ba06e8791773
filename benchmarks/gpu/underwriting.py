"""The synthetic underwriting task behind the GPU model fixture: rule set, applicants, answer formats.

Pure Python (no torch), so the rule set can be read, tested and reused by the build, check and benchmark scripts on
any machine. Everything is seeded: the same seed gives the same applicants.

Rule set (version 1). An applicant has four fields:
  income            annual income in whole currency units, 12,000 .. 240,000
  debt_ratio        monthly debt payments / monthly income, 0.00 .. 0.80 (two decimals)
  employment_years  whole years with the current employer, 0 .. 35
  claims_last_5y    insurance claims filed in the last five years, 0 .. 7
The decision is taken in K = 4 steps, one factor per step, in this order; each step names one reasoning code and the
decision as it stands after that factor (so the last step's label is the final decision):
  1. income            INCOME_LOW   if income < 30,000                              else INCOME_OK
  2. debt ratio        DTI_HIGH     if debt_ratio > 0.43                            else DTI_OK
  3. employment        TENURE_SHORT if employment_years < 2                         else TENURE_OK
  4. claims history    CLAIMS_HIGH  if claims_last_5y >= 3                          else CLAIMS_OK
  rejected as soon as any of INCOME_LOW, DTI_HIGH, CLAIMS_HIGH is found, or TENURE_SHORT with income < 60,000
  (a short tenure is tolerated for high earners); approved otherwise.
The same rules, written in CEL, are the decision server's rules fallback (see `CEL_RULES`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

APPROVE = "approved"
REJECT = "rejected"
LABELS = (APPROVE, REJECT)
STEPS = 4
CODES = (
    "INCOME_OK",
    "INCOME_LOW",
    "DTI_OK",
    "DTI_HIGH",
    "TENURE_OK",
    "TENURE_SHORT",
    "CLAIMS_OK",
    "CLAIMS_HIGH",
)
# The fused scored format's tokens: every code immediately followed by every label, one token each.
PAIRS = tuple(code + label for code in CODES for label in LABELS)
INCOME_MIN = 30_000
DTI_MAX = 0.43
TENURE_MIN = 2
TENURE_WAIVER_INCOME = 60_000
CLAIMS_MAX = 3  # this many or more rejects

INPUT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["income", "debt_ratio", "employment_years", "claims_last_5y"],
    "properties": {
        "income": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
        "debt_ratio": {"type": "number", "minimum": 0, "maximum": 5},
        "employment_years": {"type": "integer", "minimum": 0, "maximum": 80},
        "claims_last_5y": {"type": "integer", "minimum": 0, "maximum": 100},
    },
}

# The rules fallback: the same rule set in CEL, as the runtime's fallback evaluates it. The runtime hands CEL every
# JSON number as a double, so the literals are doubles too.
CEL_RULES = [
    {"name": "income-too-low", "when": f"input.income < {float(INCOME_MIN)}", "decision": REJECT,
     "reasoningCode": "INCOME_LOW"},
    {"name": "debt-ratio-too-high", "when": f"input.debt_ratio > {DTI_MAX}", "decision": REJECT,
     "reasoningCode": "DTI_HIGH"},
    {"name": "short-tenure-low-income",
     "when": f"input.employment_years < {float(TENURE_MIN)} && input.income < {float(TENURE_WAIVER_INCOME)}",
     "decision": REJECT, "reasoningCode": "TENURE_SHORT"},
    {"name": "too-many-claims", "when": f"input.claims_last_5y >= {float(CLAIMS_MAX)}", "decision": REJECT,
     "reasoningCode": "CLAIMS_HIGH"},
    {"name": "default-approve", "when": "true", "decision": APPROVE, "reasoningCode": "CLAIMS_OK"},
]


@dataclass(frozen=True)
class Step:
    code: str
    label: str


def decide(applicant: dict) -> list[Step]:
    """The rule set's K steps for one applicant; the last step's label is the decision."""
    income = applicant["income"]
    rejected = False
    steps = []
    low = income < INCOME_MIN
    rejected |= low
    steps.append(Step("INCOME_LOW" if low else "INCOME_OK", REJECT if rejected else APPROVE))
    high = applicant["debt_ratio"] > DTI_MAX
    rejected |= high
    steps.append(Step("DTI_HIGH" if high else "DTI_OK", REJECT if rejected else APPROVE))
    short = applicant["employment_years"] < TENURE_MIN
    rejected |= short and income < TENURE_WAIVER_INCOME
    steps.append(Step("TENURE_SHORT" if short else "TENURE_OK", REJECT if rejected else APPROVE))
    many = applicant["claims_last_5y"] >= CLAIMS_MAX
    rejected |= many
    steps.append(Step("CLAIMS_HIGH" if many else "CLAIMS_OK", REJECT if rejected else APPROVE))
    return steps


def decision(applicant: dict) -> str:
    return decide(applicant)[-1].label


def applicants(n: int, seed: int) -> list[dict]:
    """n applicants drawn so that each rule fires often enough to be learned and about half are approved.

    Values near each threshold are over-sampled: a model that has only seen clear cases learns a blurred boundary.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            income = rng.randint(INCOME_MIN - 4_000, INCOME_MIN + 4_000)
        elif r < 0.4:
            income = rng.randint(TENURE_WAIVER_INCOME - 6_000, TENURE_WAIVER_INCOME + 6_000)
        elif r < 0.55:
            income = rng.randint(12_000, INCOME_MIN)
        else:
            income = rng.randint(INCOME_MIN, 240_000)
        if rng.random() < 0.35:
            debt_ratio = round(rng.uniform(DTI_MAX - 0.06, DTI_MAX + 0.06), 2)
        else:
            debt_ratio = round(rng.uniform(0.0, 0.6), 2)
        employment_years = rng.choice([0, 1, 1, 2, 2, 3]) if rng.random() < 0.4 else rng.randint(0, 35)
        claims = rng.choice([2, 3]) if rng.random() < 0.3 else min(7, int(rng.expovariate(0.7)))
        out.append({"income": income, "debt_ratio": debt_ratio, "employment_years": employment_years,
                    "claims_last_5y": claims})
    return out


def applicant_text(applicant: dict) -> str:
    """The applicant as the runtime puts it into the prompt: compact JSON with sorted keys."""
    return json.dumps(applicant, sort_keys=True, separators=(",", ":"))


def compact_answer(steps: list[Step]) -> str:
    """The scored-mode answer in the compact format (the default): code then label per step, no separators."""
    return "".join(f"{s.code}{s.label}" for s in steps)


def lines_answer(steps: list[Step]) -> str:
    """The scored-mode answer: one `code:label` line per step (what the runtime's regex constraint allows)."""
    return "".join(f"{s.code}:{s.label}\n" for s in steps)


# Probabilities the generated-mode answer writes for a step; the model learns them as text.
_GEN_CONFIDENCE = 0.97


def trajectory_answer(steps: list[Step]) -> str:
    """The generated-mode answer: the trajectory JSON document the model writes itself.

    The shape is the runtime's trajectory schema (arbiter_runtime.trajectory.derived_output_schema):
    {"steps": [{"confidence": p, "label": l, "probabilities": {label: p, ...}, "reasoningCode": c, "step": n}]}.
    Keys are written sorted, because that is the order of the schema the runtime constrains generation with: the
    decision.json it reads (the operator's ConfigMap, as the apiserver hands objects back) has every key sorted, and
    vLLM's JSON-schema grammar makes the model write properties in the schema's order. (Trained in the schema's
    written order instead, the first GPU run got 0% valid generated trajectories: see docs/gpu.md.)
    """
    doc_steps = []
    for i, s in enumerate(steps, start=1):
        probs = {lab: (_GEN_CONFIDENCE if lab == s.label else round(1 - _GEN_CONFIDENCE, 2)) for lab in LABELS}
        doc_steps.append({"step": i, "reasoningCode": s.code, "label": s.label, "probabilities": probs,
                          "confidence": _GEN_CONFIDENCE})
    return json.dumps({"steps": doc_steps}, separators=(",", ":"), sort_keys=True)


def parse_lines(text: str) -> list[Step] | None:
    """Parse a scored-mode answer; None when it is not exactly STEPS well-formed lines."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if len(lines) != STEPS:
        return None
    out = []
    for line in lines:
        code, sep, label = line.partition(":")
        if not sep or code not in CODES or label not in LABELS:
            return None
        out.append(Step(code, label))
    return out


def lines_regex() -> str:
    """The regex a client constrains a scored-mode answer with (vLLM `structured_outputs: {"regex": ...}`)."""
    codes = "|".join(CODES)
    labels = "|".join(LABELS)
    return f"(({codes}):({labels})\\n){{{STEPS}}}"


MODEL_NAME = "underwriting"
MODEL_VERSION = "1.0.0"


def output_schema(bounds: bool = True) -> dict:
    """The trajectory schema of this fixture (the shape the runtime writes in scored mode and checks in both).

    bounds=False leaves out the numeric ranges (probabilities in [0, 1], step in [1, K]); the runtime still checks
    them after generation. Used only by generated_diag.py to find which constraint the model cannot write under."""
    prob = {"type": "number", "minimum": 0, "maximum": 1} if bounds else {"type": "number"}
    step = {
        "type": "object",
        "properties": {
            "step": {"type": "integer", "minimum": 1, "maximum": STEPS} if bounds else {"type": "integer"},
            "reasoningCode": {"type": "string", "enum": list(CODES)},
            "label": {"type": "string", "enum": list(LABELS)},
            "probabilities": {"type": "object", "properties": {lab: prob for lab in LABELS},
                              "required": list(LABELS), "additionalProperties": False},
            "confidence": prob,
        },
        "required": ["step", "reasoningCode", "probabilities", "confidence"],
        "additionalProperties": False,
    }
    return {"type": "object",
            "properties": {"steps": {"type": "array", "items": step, "minItems": STEPS, "maxItems": STEPS}},
            "required": ["steps"], "additionalProperties": False}


def decision_model(gpus: int = 1, mode: str = "scored", bounds: bool = True, scored_format: str = "compact",
                   version_vllm: dict | None = None, extra_args: list[str] | None = None,
                   serving_vllm: dict | None = None) -> dict:
    """The DecisionModel a user would apply for this fixture; the operator's builders render vLLM args and
    decision.json from it. maxNumSeqs covers the benchmark's highest concurrency (64) with room to spare.
    `version_vllm`: the version's own vLLM settings (quantization, kvCacheDtype); `extra_args`: extraArgs;
    `serving_vllm`: more of spec.serving.vllm (apiServers, structuredOutputsBackend)."""
    dm = {
        "apiVersion": "arbiter.dev/v1alpha1",
        "kind": "DecisionModel",
        "metadata": {"name": MODEL_NAME, "namespace": "gpu-bench", "uid": "00000000-0000-0000-0000-000000000009"},
        "spec": {
            "model": {"name": MODEL_NAME, "architecture": "GemmaForCausalLM"},
            "versions": [{
                "name": MODEL_VERSION,
                "storageUri": f"s3://models/{MODEL_NAME}/{MODEL_VERSION}",
                "metadata": {
                    "inputSchema": INPUT_SCHEMA,
                    "outputSchema": output_schema(bounds),
                    "sla": {"p95LatencyMs": 150},
                    "trainingData": {"from": "2026-11-30", "to": "2026-11-30"},
                    "biasReportUrl": "https://example.com/arbiter/gpu-fixture/bias-report.html",
                },
            }],
            "promote": {"version": MODEL_VERSION},
            "serving": {"gpus": gpus, "gpuProduct": "NVIDIA-H200",
                        "vllm": {"maxModelLen": 2048, "maxNumSeqs": 128, "seed": 42, "extraArgs": extra_args or [],
                                 **(serving_vllm or {})}},
            "decision": {
                "labels": list(LABELS),
                "reasoningCodes": list(CODES),
                "steps": STEPS,
                "trajectoryMode": mode,
                "scoredFormat": scored_format,
                "confidenceThreshold": 0.0,
                "lowConfidencePolicy": "flag",
                "deadlineMs": 5000,
                "fallbackRules": CEL_RULES,
            },
        },
    }
    if version_vllm:
        dm["spec"]["versions"][0]["vllm"] = version_vllm
    return dm
