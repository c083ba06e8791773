"""The decision config (`decision.json`) the operator renders into a ConfigMap, parsed and checked at start-up.

Everything that can be wrong with a config is reported here, before the server listens, with the key that is
wrong and what to write instead; the decision path then trusts these values. docs/runtime.md is the reference.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

CONFIG_ENV = "ARBITER_DECISION_CONFIG"
# vLLM's own default port; the decision server takes 8080, the port KServe's predictor Service targets.
DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8000/v1"

# Labels and codes are written by the model under a regex constraint and parsed back from its text, so they are
# kept to characters that need no escaping tricks in any structured-outputs backend and cannot contain the
# separator (":") or the line end.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class ConfigError(ValueError):
    """The config cannot be served; the message names the key and says what to change."""


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


_KNOWN = {
    "model", "version", "labels", "reasoningCodes", "steps", "trajectoryMode", "confidenceThreshold",
    "lowConfidencePolicy", "deadlineMs", "inputSchema", "outputSchema", "fallbackRules", "sla", "diffusion",
    "upstream", "instructions", "probabilityTolerance", "scoredFormat",
}


def _names(raw: Any, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{key}: must be a non-empty list of strings")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not NAME_RE.match(item):
            raise ConfigError(
                f"{key}[{i}]: {item!r} is not allowed; use 1-64 characters of letters, digits, '_', '.', '-', "
                "starting with a letter or digit")
        out.append(item)
    if len(set(out)) != len(out):
        dup = sorted({x for x in out if out.count(x) > 1})
        raise ConfigError(f"{key}: duplicate entries {dup}")
    return tuple(out)


def _int(raw: dict, key: str, default: int | None, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{key}: required (an integer from {lo} to {hi})")
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{key}: {value!r} must be an integer from {lo} to {hi}")
    return value


def _schema(raw: dict, key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a JSON Schema object (or empty)")
    if value:
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ConfigError(f"{key}: not a valid JSON Schema at {where}: {exc.message}") from None
    return value


def parse_config(raw: Any) -> DecisionConfig:
    """Check a decoded decision.json and return the typed config, or raise ConfigError naming the key."""
    if not isinstance(raw, dict):
        raise ConfigError("the decision config must be a JSON object")
    # A renderer may write null for "not set": that is the default, as if the key were absent.
    raw = {k: v for k, v in raw.items() if v is not None}
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ConfigError(f"unknown keys {unknown}; known keys are {sorted(_KNOWN)}")
    for key in ("model", "version"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{key}: required non-empty string")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", raw["model"]):
        raise ConfigError(f"model: {raw['model']!r} must be letters, digits, '_', '.', '-' (it is a URL path segment)")
    labels = _names(raw.get("labels"), "labels")
    if len(labels) < 2:
        raise ConfigError("labels: at least two labels are needed for a decision")
    codes = _names(raw.get("reasoningCodes"), "reasoningCodes")
    steps = _int(raw, "steps", 1, 1, 32)
    mode = raw.get("trajectoryMode")
    diffusion = raw.get("diffusion", False)
    if not isinstance(diffusion, bool):
        raise ConfigError("diffusion: must be true or false")
    if mode is None:
        mode = "generated" if diffusion else "scored"
    if mode not in ("scored", "generated"):
        raise ConfigError(f"trajectoryMode: {mode!r} must be 'scored' or 'generated'")
    if diffusion and mode == "scored":
        raise ConfigError(
            "trajectoryMode: diffusion models get no structured outputs in vLLM 0.26, so they cannot run in "
            "'scored' mode; set trajectoryMode: generated")
    from .scored_format import DEFAULT_FORMAT, scored_format

    fmt = raw.get("scoredFormat", DEFAULT_FORMAT)
    try:
        if not isinstance(fmt, str):
            raise ValueError(f"scoredFormat: {fmt!r} must be 'compact' or 'lines'")
        if mode == "scored":  # the names must fit the format; generated mode never uses it
            scored_format(fmt, labels, codes, steps)
        elif fmt not in ("compact", "lines"):
            raise ValueError(f"scoredFormat: {fmt!r} must be 'compact' or 'lines'")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    threshold = raw.get("confidenceThreshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"confidenceThreshold: {threshold!r} must be a number from 0 to 1")
    policy = raw.get("lowConfidencePolicy", "flag")
    if policy not in ("flag", "fallback"):
        raise ConfigError(f"lowConfidencePolicy: {policy!r} must be 'flag' or 'fallback'")
    deadline = _int(raw, "deadlineMs", 1000, 1, 600_000)
    # The runtime computes scored probabilities itself (exact); a model writing digits rounds them.
    tolerance = raw.get("probabilityTolerance", 1e-3 if mode == "scored" else 1e-2)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 0.5:
        raise ConfigError(f"probabilityTolerance: {tolerance!r} must be a number between 0 and 0.5")
    input_schema = _schema(raw, "inputSchema")
    output_schema = _schema(raw, "outputSchema")

    rules_raw = raw.get("fallbackRules", [])
    if not isinstance(rules_raw, list):
        raise ConfigError("fallbackRules: must be a list of {name, when, decision, reasoningCode}")
    rules = []
    seen: set[str] = set()
    for i, rule in enumerate(rules_raw):
        where = f"fallbackRules[{i}]"
        if not isinstance(rule, dict):
            raise ConfigError(f"{where}: must be an object with name, when, decision, reasoningCode")
        extra = sorted(set(rule) - {"name", "when", "decision", "reasoningCode"})
        if extra:
            raise ConfigError(f"{where}: unknown keys {extra}")
        for key in ("name", "when", "decision", "reasoningCode"):
            if not isinstance(rule.get(key), str) or not rule[key].strip():
                raise ConfigError(f"{where}.{key}: required non-empty string")
        if rule["name"] in seen:
            raise ConfigError(f"{where}.name: duplicate rule name {rule['name']!r}")
        seen.add(rule["name"])
        if rule["decision"] not in labels:
            raise ConfigError(f"{where}.decision: {rule['decision']!r} is not one of labels {list(labels)}")
        if rule["reasoningCode"] not in codes:
            raise ConfigError(
                f"{where}.reasoningCode: {rule['reasoningCode']!r} is not one of reasoningCodes {list(codes)}")
        rules.append(FallbackRule(rule["name"], rule["when"], rule["decision"], rule["reasoningCode"]))

    sla = raw.get("sla") or {}
    if not isinstance(sla, dict):
        raise ConfigError("sla: must be an object like {\"p95LatencyMs\": 150}")
    p95 = sla.get("p95LatencyMs")
    if p95 is not None and (isinstance(p95, bool) or not isinstance(p95, int) or p95 <= 0):
        raise ConfigError(f"sla.p95LatencyMs: {p95!r} must be a positive integer")

    up = raw.get("upstream") or {}
    if not isinstance(up, dict):
        raise ConfigError("upstream: must be an object")
    extra = sorted(set(up) - {"url", "servedModelName", "maxRetries", "maxTokens", "apiKeyEnv"})
    if extra:
        raise ConfigError(f"upstream: unknown keys {extra}")
    url = up.get("url", DEFAULT_UPSTREAM_URL)
    if not isinstance(url, str) or not re.match(r"^https?://", url):
        raise ConfigError(f"upstream.url: {url!r} must be an http(s) URL such as {DEFAULT_UPSTREAM_URL}")
    served = up.get("servedModelName") or raw["model"]
    if not isinstance(served, str):
        raise ConfigError("upstream.servedModelName: must be a string")
    retries = _int(up, "maxRetries", 2, 0, 10)
    max_tokens = _int(up, "maxTokens", 0, 0, 1_000_000)
    key_env = up.get("apiKeyEnv", "")
    if not isinstance(key_env, str):
        raise ConfigError("upstream.apiKeyEnv: must be the name of an environment variable")
    instructions = raw.get("instructions", "")
    if not isinstance(instructions, str):
        raise ConfigError("instructions: must be a string")

    return DecisionConfig(
        model=raw["model"], version=raw["version"], labels=labels, reasoning_codes=codes, steps=steps,
        trajectory_mode=mode, confidence_threshold=float(threshold), low_confidence_policy=policy,
        deadline_ms=deadline, input_schema=input_schema, output_schema=output_schema,
        fallback_rules=tuple(rules), sla_p95_latency_ms=p95, diffusion=diffusion,
        upstream=UpstreamConfig(url=url.rstrip("/"), served_model_name=served, max_retries=retries,
                                max_tokens=max_tokens, api_key_env=key_env),
        instructions=instructions, probability_tolerance=float(tolerance), scored_format=fmt,
    )


def load_config(path: str | os.PathLike | None = None) -> DecisionConfig:
    """Read the config from `path` or $ARBITER_DECISION_CONFIG."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no decision config: set {CONFIG_ENV} to the path of decision.json")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read decision config {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"decision config {path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") \
            from None
    try:
        return parse_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"decision config {path}: {exc}") from None
