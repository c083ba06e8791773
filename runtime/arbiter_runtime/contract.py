"""`decision.json`: the contract between the operator (which renders it into each version's ConfigMap) and the
runtime (which reads it at start-up). One pydantic model, imported by both sides; this module imports nothing but
pydantic and the standard library, so the operator can import it without the runtime's dependencies.

The model checks what a file alone can say (types, ranges, names, cross-references between keys). What needs the
runtime's own code (JSON Schema validity, whether the names fit the scored format, defaults that depend on the
mode) is checked by `config.parse_config` on top. Every problem is reported as `DecisionJsonError` naming the key
and what to write instead (docs/runtime.md lists the keys).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator
from pydantic_core import PydanticCustomError

# vLLM's own default port; the decision server takes 8080, the port KServe's predictor Service targets.
DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8000/v1"

# Labels and codes are written by the model under a regex constraint and parsed back from its text, so they are
# kept to characters that need no escaping tricks in any structured-outputs backend and cannot contain the
# separator (":") or the line end.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
# Not blank: at least one character that is not white space.
Text = Annotated[str, StringConstraints(pattern=r"\S")]

# vLLM 0.26 returns the log-probabilities of at most this many requested token ids per position
# (SamplingParams MAX_LOGPROB_TOKEN_IDS); a fused decision asks for every (code, label) pair.
MAX_LOGPROB_TOKEN_IDS = 128


def prefix_clashes(names: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """Pairs (a, b) where a is a proper prefix of b: such a list cannot be read back without separators."""
    ordered = sorted(names)
    # In sorted order a prefix sits right before the names it starts, so neighbours suffice to find one; collect all.
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:] if b.startswith(a)]


def scored_names_problem(fmt: str, labels: list[str] | tuple[str, ...],
                         codes: list[str] | tuple[str, ...]) -> str | None:
    """Why a scored format cannot be read back with these names (what to change), or None. The runtime's formats
    refuse with it (scored_format.py), the operator before anything is deployed (plan/validate.py)."""
    if fmt in ("compact", "fused"):  # no separators: the text must split one way only
        for what, names in (("reasoningCodes", codes), ("labels", labels)):
            clash = prefix_clashes(names)
            if clash:
                a, b = clash[0]
                return (f"{what}: {a!r} is the start of {b!r}, so scoredFormat {fmt} (no separators) cannot tell them "
                        "apart; rename one, or set scoredFormat: lines")
    pairs = len(codes) * len(labels)
    if fmt == "fused" and pairs > MAX_LOGPROB_TOKEN_IDS:
        return (f"scoredFormat fused reads {len(codes)} reasoningCodes x {len(labels)} labels = {pairs} pair tokens at "
                f"each step, and vLLM returns the log-probabilities of at most {MAX_LOGPROB_TOKEN_IDS}; use fewer "
                "codes or labels, or scoredFormat: compact")
    return None


class DecisionJsonError(ValueError):
    """decision.json cannot be served; the message names the key and says what to change."""


class _Part(BaseModel):
    # strict: JSON's types as they are (no "2" for 2, no true for 1); frozen: the runtime trusts what it checked.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FallbackRule(_Part):
    name: Text
    when: Text
    decision: Text
    reasoningCode: Text


class Sla(_Part):
    # The version's other SLA figures are the operator's (promotion analysis); the runtime ignores them.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    p95LatencyMs: int | None = Field(None, gt=0)


class Upstream(_Part):
    url: Annotated[str, StringConstraints(pattern=r"^https?://")] = DEFAULT_UPSTREAM_URL
    servedModelName: str = ""  # empty: the model's name
    maxRetries: int = Field(2, ge=0, le=10)
    maxTokens: int = Field(0, ge=0, le=1_000_000)  # 0: derived (scored: exact bound; generated: 1024)
    apiKeyEnv: str = ""  # name of an env var holding a bearer token; the value is never logged


class DecisionJson(_Part):
    model: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
    version: Annotated[str, StringConstraints(min_length=1)]
    labels: list[Name] = Field(min_length=1)
    reasoningCodes: list[Name] = Field(min_length=1)
    steps: int = Field(1, ge=1, le=32)
    trajectoryMode: Literal["scored", "generated"] | None = None  # None: generated for diffusion models, else scored
    scoredFormat: Literal["compact", "fused", "lines"] = "compact"
    confidenceThreshold: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    lowConfidencePolicy: Literal["flag", "fallback"] = "flag"
    deadlineMs: int = Field(1000, ge=1, le=600_000)
    probabilityTolerance: float | None = Field(None, gt=0, lt=0.5, allow_inf_nan=False)  # None: by mode
    inputSchema: dict[str, Any] = Field(default_factory=dict)
    outputSchema: dict[str, Any] = Field(default_factory=dict)
    fallbackRules: list[FallbackRule] = Field(default_factory=list)
    sla: Sla = Field(default_factory=Sla)
    diffusion: bool = False
    upstream: Upstream = Field(default_factory=Upstream)
    instructions: str = ""

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, raw: Any) -> Any:
        # A renderer may write null for "not set": that is the default, as if the key were absent.
        return {k: v for k, v in raw.items() if v is not None} if isinstance(raw, dict) else raw

    @model_validator(mode="after")
    def _cross_references(self) -> DecisionJson:
        if len(self.labels) < 2:
            _refuse("labels: at least two labels are needed for a decision")
        for key in ("labels", "reasoningCodes"):
            names: list[str] = getattr(self, key)
            if len(set(names)) != len(names):
                _refuse(f"{key}: duplicate entries {sorted({x for x in names if names.count(x) > 1})}")
        seen: set[str] = set()
        for i, rule in enumerate(self.fallbackRules):
            where = f"fallbackRules[{i}]"
            if rule.name in seen:
                _refuse(f"{where}.name: duplicate rule name {rule.name!r}")
            seen.add(rule.name)
            if rule.decision not in self.labels:
                _refuse(f"{where}.decision: {rule.decision!r} is not one of labels {self.labels}")
            if rule.reasoningCode not in self.reasoningCodes:
                _refuse(f"{where}.reasoningCode: {rule.reasoningCode!r} is not one of reasoningCodes "
                        f"{self.reasoningCodes}")
        return self

    def to_json(self) -> dict[str, Any]:
        """The keys that were set, as JSON values: what the operator writes (defaults stay the runtime's)."""
        return self.model_dump(mode="json", exclude_unset=True)


def _refuse(message: str) -> None:
    raise PydanticCustomError("decision_json", message)


# What to write instead, by key (list items as `key[]`): the second half of each message.
_MUST = {
    "model": "letters, digits, '_', '.', '-' (it is a URL path segment)",
    "version": "a non-empty string",
    "labels": "a non-empty list of strings",
    "reasoningCodes": "a non-empty list of strings",
    "labels[]": "1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
    "reasoningCodes[]": "1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
    "steps": "an integer from 1 to 32",
    "trajectoryMode": "'scored' or 'generated'",
    "scoredFormat": "one of compact, fused, lines",
    "confidenceThreshold": "a number from 0 to 1",
    "lowConfidencePolicy": "'flag' or 'fallback'",
    "deadlineMs": "an integer from 1 to 600000",
    "probabilityTolerance": "a number between 0 and 0.5",
    "inputSchema": "a JSON Schema object (or empty)",
    "outputSchema": "a JSON Schema object (or empty)",
    "fallbackRules": "a list of {name, when, decision, reasoningCode}",
    "fallbackRules[]": "an object with name, when, decision, reasoningCode",
    "sla": "an object like {\"p95LatencyMs\": 150}",
    "sla.p95LatencyMs": "a positive integer",
    "diffusion": "true or false",
    "upstream": "an object",
    "upstream.url": f"an http(s) URL such as {DEFAULT_UPSTREAM_URL}",
    "upstream.servedModelName": "a string",
    "upstream.maxRetries": "an integer from 0 to 10",
    "upstream.maxTokens": "an integer from 0 to 1000000",
    "upstream.apiKeyEnv": "the name of an environment variable",
    "instructions": "a string",
}
for _key in ("name", "when", "decision", "reasoningCode"):
    _MUST[f"fallbackRules[].{_key}"] = "a non-empty string"


def _path(loc: tuple[int | str, ...], items: bool = True) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]" if items else "[]"
        else:
            out += f".{part}" if out else part
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def explain(exc: ValidationError) -> str:
    """One line per problem, each naming the key and what to write there."""
    unknown: dict[str, list[str]] = {}
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.setdefault(_path(loc[:-1]), []).append(str(loc[-1]))
            continue
        if not loc:
            lines.append(err["msg"] if err["type"] == "decision_json" else "the decision config must be a JSON object")
            continue
        where = _path(loc)
        if err["type"] == "decision_json":
            lines.append(err["msg"])
        elif err["type"] == "missing":
            lines.append(f"{where}: required ({_MUST.get(_path(loc, items=False), 'see docs/runtime.md')})")
        else:
            must = _MUST.get(_path(loc, items=False))
            lines.append(f"{where}: must be {must} (got {_shown(err['input'])})" if must else f"{where}: {err['msg']}")
    for where, keys in unknown.items():
        if where:
            lines.insert(0, f"{where}: unknown keys {sorted(keys)}")
        else:
            known = sorted(DecisionJson.model_fields)
            lines.insert(0, f"unknown keys {sorted(keys)}; known keys are {known}")
    return "; ".join(dict.fromkeys(lines))


def read_decision_json(raw: Any) -> DecisionJson:
    """Check a decoded decision.json against the contract, or raise DecisionJsonError naming each wrong key."""
    try:
        return DecisionJson.model_validate(raw)
    except ValidationError as exc:
        raise DecisionJsonError(explain(exc)) from None
