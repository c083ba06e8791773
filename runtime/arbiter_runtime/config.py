"""The decision config (`decision.json`) the operator renders into a ConfigMap, parsed and checked at start-up.

Everything that can be wrong with a config is reported here, before the server listens, with the key that is
wrong and what to write instead; the decision path then trusts these values. docs/runtime.md is the reference.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from .contract import DEFAULT_UPSTREAM_URL, DecisionJsonError, read_decision_json

CONFIG_ENV = "ARBITER_DECISION_CONFIG"
# The config cannot be served; the message names the key and says what to change.
ConfigError = DecisionJsonError


@dataclass(frozen=True)
class FallbackRule:
    name: str
    when: str
    decision: str
    reasoning_code: str


@dataclass(frozen=True)
class UpstreamConfig:
    url: str = DEFAULT_UPSTREAM_URL
    served_model_name: str = ""
    max_retries: int = 2
    max_tokens: int = 0  # 0: derived (scored: exact bound; generated: 1024)
    api_key_env: str = ""  # name of an env var holding a bearer token; the value is never logged
    # The pod's vLLM engines when it runs more than one (spec.serving.vllm.engines): `url` is the first; a
    # request goes to the engine with the fewest in flight (upstream.EnginePicker).
    engines: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine's OpenAI base URL (just `url` for one engine)."""
        return self.engines or (self.url,)


@dataclass(frozen=True)
class DecisionConfig:
    model: str
    version: str
    labels: tuple[str, ...]
    reasoning_codes: tuple[str, ...]
    steps: int
    trajectory_mode: str
    confidence_threshold: float
    low_confidence_policy: str
    deadline_ms: int
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    fallback_rules: tuple[FallbackRule, ...]
    sla_p95_latency_ms: int | None
    diffusion: bool
    upstream: UpstreamConfig
    instructions: str = ""
    probability_tolerance: float = 1e-3
    scored_format: str = "compact"  # scored_format.FORMATS: what the model writes in scored mode
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def deadline_s(self) -> float:
        return self.deadline_ms / 1000.0

    @property
    def label_joiner(self) -> str:
        """The text between a reasoning code and its label in scored mode (scored_format.py)."""
        return ":" if self.scored_format == "lines" else ""


def _schema(key: str, value: dict[str, Any]) -> dict[str, Any]:
    if value:
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ConfigError(f"{key}: not a valid JSON Schema at {where}: {exc.message}") from None
    return value


def parse_config(raw: Any) -> DecisionConfig:
    """Check a decoded decision.json and return the typed config, or raise ConfigError naming the key."""
    doc = read_decision_json(raw)  # the contract the operator renders with (contract.py)
    mode = doc.trajectoryMode or ("generated" if doc.diffusion else "scored")
    if doc.diffusion and mode == "scored":
        raise ConfigError(
            "trajectoryMode: diffusion models get no structured outputs in vLLM 0.26, so they cannot run in "
            "'scored' mode; set trajectoryMode: generated")
    labels, codes = tuple(doc.labels), tuple(doc.reasoningCodes)
    if mode == "scored":  # the names must fit the format; generated mode never uses it
        from .scored_format import scored_format

        try:
            scored_format(doc.scoredFormat, labels, codes, doc.steps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    # The runtime computes scored probabilities itself (exact); a model writing digits rounds them.
    tolerance = doc.probabilityTolerance or (1e-3 if mode == "scored" else 1e-2)
    up = doc.upstream
    return DecisionConfig(
        model=doc.model, version=doc.version, labels=labels, reasoning_codes=codes, steps=doc.steps,
        trajectory_mode=mode, confidence_threshold=float(doc.confidenceThreshold),
        low_confidence_policy=doc.lowConfidencePolicy, deadline_ms=doc.deadlineMs,
        input_schema=_schema("inputSchema", doc.inputSchema), output_schema=_schema("outputSchema", doc.outputSchema),
        fallback_rules=tuple(FallbackRule(r.name, r.when, r.decision, r.reasoningCode) for r in doc.fallbackRules),
        sla_p95_latency_ms=doc.sla.p95LatencyMs, diffusion=doc.diffusion,
        upstream=UpstreamConfig(url=up.url.rstrip("/"), served_model_name=up.servedModelName or doc.model,
                                max_retries=up.maxRetries, max_tokens=up.maxTokens, api_key_env=up.apiKeyEnv),
        instructions=doc.instructions, probability_tolerance=float(tolerance), scored_format=doc.scoredFormat,
    )


def load_config(path: str | os.PathLike[str] | None = None) -> DecisionConfig:
    """Read the config from `path` or $ARBITER_DECISION_CONFIG."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no decision config: set {CONFIG_ENV} to the path of decision.json")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read decision config {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"decision config {path} is not UTF-8 text: byte {exc.start}: {exc.reason}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"decision config {path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") \
            from None
    except RecursionError:
        raise ConfigError(f"decision config {path} is nested too deeply to be a decision config") from None
    try:
        return parse_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"decision config {path}: {exc}") from None
