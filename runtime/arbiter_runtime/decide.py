"""The decision path: prompt -> constrained upstream call -> trajectory -> checks -> decision, or the rules.

Two trajectory modes (docs/runtime.md):
- scored: per step the model writes a code and a label (scored_format.py: `CODELABEL` without separators, or one
  line `CODE:LABEL`) under a structured_outputs regex; each label's
  probability is read from the label tokens' log-probabilities (`logprob_token_ids`) at the position where the
  label is written, normalised over the labels. The runtime writes the trajectory JSON itself.
- generated: the model writes the trajectory JSON (structured_outputs {"json": schema}); diffusion models get no
  constraint and no seed (vLLM 0.26 rejects both) and are validated after generation.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from .config import DecisionConfig
from .fallback import RulesEngine
from .jsonutil import loads, reject_constant
from .metrics import Metrics
from .scored_format import scored_format
from .tokens import LabelTokens
from .trajectory import TrajectoryChecker, TrajectoryInvalid, derived_output_schema
from .upstream import EnginePicker, UpstreamClient, UpstreamFailure, answer_bound
from .wire import WireError, check_choice

MASKED_AT = -9998.0  # vLLM writes -inf (a token the constraint masks) as -9999.0


def fallback_reserve_s(deadline_s: float) -> float:
    """The least time kept back from the model for the rules and the answer."""
    return min(0.1 * deadline_s, 0.025)


# The words of vLLM's 400 answer to a prompt that leaves no room for max_tokens within --max-model-len.
CONTEXT_LENGTH_REFUSAL = b"maximum context length"

class DeadlineReserve:
    """How much of deadlineMs the model gets, learnt from how late deadline fallbacks actually land.

    Under load many decisions time out together and their rules and answers queue on one event loop, so a fixed
    reserve is either too small (fallbacks late) or wasteful. Each deadline fallback reports its latency: one
    that lands after 85% of the deadline (the rest is for what the server cannot see: queueing before the handler
    runs, the network) grows the reserve by a tenth of its overshoot; one that lands earlier shrinks it by a
    fiftieth of that rate. The reserve settles where late fallbacks are rare, between the floor above and
    half the deadline. A model answer within its budget relaxes the reserve by RELAX of its excess over the floor:
    once the upstream is healthy again the model gets its time back (a few hundred answers after a stall), instead
    of keeping the reserve a burst of timeouts had grown.
    """

    GROW, SHRINK, TARGET, RELAX = 0.1, 0.002, 0.85, 0.01

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self.floor = fallback_reserve_s(deadline_s)
        self.s = self.floor

    def observe(self, latency_s: float) -> None:
        error = latency_s - self.TARGET * self.deadline_s
        step = self.GROW * error if error > 0 else self.SHRINK * error
        self.s = min(max(self.s + step, self.floor), self.deadline_s / 2)

    def relax(self) -> None:
        if self.s > self.floor:
            self.s -= self.RELAX * (self.s - self.floor)


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_digest(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def derive_seed(cfg: DecisionConfig, canonical: str) -> int:
    """Same model version + same input -> same seed -> same answer (vLLM takes a non-negative int)."""
    h = hashlib.sha256(f"{cfg.model}\x00{cfg.version}\x00{canonical}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


@dataclass
class Outcome:
    decision: str | None
    confidence: float | None  # None: a rules decision (the rules estimate no probability)
    trajectory: dict[str, Any]
    source: str  # model | rules | none
    outcome: str  # ok | low_confidence | fallback | error
    flagged: bool = False
    fallback_reason: str | None = None
    rule: str | None = None
    error: str | None = None
    attempts: int = 0
    upstream_s: float = 0.0
    notes: list[str] = field(default_factory=list)


DEFAULT_INSTRUCTIONS = ("You are a decision model. Read the case in the user message and decide it, reasoning in "
                        "steps.")


class ScoredMode:
    def __init__(self, cfg: DecisionConfig, tokens: LabelTokens):
        self.cfg = cfg
        self.tokens = tokens
        # What the model writes (scoredFormat): the regex, the answer's description and how it splits back into
        # steps live in scored_format.py.
        self.format = scored_format(cfg.scored_format, cfg.labels, cfg.reasoning_codes, cfg.steps)
        self.regex = self.format.regex
        # The bound fits any well-formed answer with its end of sequence. With single-token names the compact answer
        # is exactly 2K tokens: asking for that many ends generation on the last label and spares the forward pass
        # of the forced end of sequence. A model that spells a name in pieces is cut short there; its retry gets the
        # bound (`roomy`), so it costs one attempt, never a decision.
        bound = cfg.upstream.max_tokens or self.format.max_tokens
        exact = self.format.exact_tokens if tokens.single_token_steps and not cfg.upstream.max_tokens else None
        max_tokens = exact or bound
        self.max_tokens = max_tokens  # what request() asks for
        self.exact = exact
        self.roomy: int | None = bound if exact else None
        system = f"{cfg.instructions or DEFAULT_INSTRUCTIONS}\n{self.format.describe}"
        self._system = {"role": "system", "content": system}
        self._label_set = frozenset(cfg.labels)
        self._label_by_bytes = {tuple(x.encode()): x for x in cfg.labels}
        # fused: every (code, label) pair is asked for, and a step's entry is read by the pair's bytes.
        self.fused = self.format.name == "fused"
        if self.fused:
            self._logprob_ids = [tokens.pair_ids[(c, x)] for c in cfg.reasoning_codes for x in cfg.labels]
            self._pair_by_bytes = {tuple((c + x).encode()): (c, x) for c in cfg.reasoning_codes for x in cfg.labels}
        else:
            self._logprob_ids = [tokens.label_ids[x] for x in cfg.labels]
        self._base = {
            "model": cfg.upstream.served_model_name,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": True,
            "logprob_token_ids": self._logprob_ids,
            "structured_outputs": {"regex": self.regex},
        }
        # At every position the chosen token, in top_logprobs again, and one entry per label: an answer above this
        # is not vLLM's.
        self.max_answer_bytes = answer_bound(bound, 2 + len(self._logprob_ids))

    def request(self, canonical: str, seed: int) -> dict[str, Any]:
        body = dict(self._base)
        body["messages"] = [self._system, {"role": "user", "content": canonical}]
        body["seed"] = seed
        return body

    def parse(self, response: dict[str, Any], max_tokens: int | None = None) -> dict[str, Any]:
        """`max_tokens`: what the request asked for. finish_reason `length` is read only when that was the exact
        count and the answer is exactly that many tokens forming K whole steps: generation ended on the last label,
        and the regex allows nothing after it but the end of sequence. Any other `length` is a cut answer."""
        split, entries = self._answer(response, max_tokens)
        if self.fused:
            return {"steps": [self._fused_step(n, code, label, entries)
                              for n, (code, label, _) in enumerate(split, start=1)]}
        steps = []
        # Walk the tokens by byte offset to the position where each step's label starts.
        offset = 0
        index = 0
        for n, (code, label, label_at) in enumerate(split, start=1):
            while index < len(entries) and offset < label_at:
                offset += _token_len(entries[index])
                index += 1
            if offset != label_at or index >= len(entries):
                raise TrajectoryInvalid("logprobs", f"step {n}: no token starts where the label is written; the "
                                                    "label was merged with the text before it")
            steps.append(self._step(n, code, label, entries[index]))
        return {"steps": steps}

    def _answer(self, response: dict[str, Any], max_tokens: int | None) -> tuple[Any, list[Any]]:
        """The answer's steps as written (code, label, the label's byte offset) and its log-probability entries,
        or TrajectoryInvalid: cut short, no text, no log-probabilities."""
        choice = check_choice(response, want_logprobs=True)
        content = choice["message"].get("content")
        cut = choice.get("finish_reason") == "length"
        if cut and (self.exact is None or max_tokens != self.exact):
            raise TrajectoryInvalid("length", "the model hit max_tokens before finishing (finish_reason: length)")
        if not isinstance(content, str):
            raise TrajectoryInvalid("length" if cut else "format", "the answer has no text content")
        # The text itself stays out of error messages: they land in audit records, and an unconstrained model may
        # have echoed the input.
        try:
            split = self.format.split(content)
        except TrajectoryInvalid:
            if cut:  # stopped at max_tokens before the answer was whole: never read a cut answer
                raise TrajectoryInvalid("length", "the model hit max_tokens before finishing (finish_reason: "
                                                  "length)") from None
            raise
        entries = (choice.get("logprobs") or {}).get("content")
        if not isinstance(entries, list):
            raise TrajectoryInvalid("logprobs", "the answer carries no logprobs (request asked for logprobs: true)")
        if cut and len(entries) != self.exact:
            raise TrajectoryInvalid("length", f"finish_reason length after {len(entries)} tokens, not the "
                                              f"{self.exact} asked for")
        return split, entries

    def _step(self, n: int, code: str, label: str, entry: dict[str, Any]) -> dict[str, Any]:
        """Step n from the log-probabilities of every label at the position where its label is written."""
        found: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or ():
            tok = alt.get("token")
            if tok not in self._label_set:
                # A server that writes tokens in vocabulary form (e.g. with a word-boundary marker) still sends the
                # bytes: match on them.
                tok = self._label_by_bytes.get(tuple(alt.get("bytes") or ()))
            if tok is not None and tok not in found:
                found[tok] = float(alt["logprob"])
        return self._judged(n, code, label, found)

    def _fused_step(self, n: int, code: str, label: str, entries: list[Any]) -> dict[str, Any]:
        """Step n of a fused answer: its one token must be the pair written; the labels' probabilities are those of
        the pair tokens of the code written (each label's probability given that code, as in the compact format)."""
        entry = entries[n - 1] if n - 1 < len(entries) else {}  # wire.check_choice: each entry an object
        if self._pair_by_bytes.get(_token_bytes(entry)) != (code, label):
            raise TrajectoryInvalid("logprobs", f"step {n}: not written as its one pair token (the model spelt "
                                                "the code and label in pieces); scoredFormat fused needs a model "
                                                "fine-tuned with each pair as one token")
        found: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or ():
            pair = self._pair_by_bytes.get(_token_bytes(alt))
            if pair is not None and pair[0] == code and pair[1] not in found:
                found[pair[1]] = float(alt["logprob"])
        return self._judged(n, code, label, found)

    def _judged(self, n: int, code: str, label: str, found: dict[str, float]) -> dict[str, Any]:
        """Step n from each label's log-probability at its position: normalised over the labels, and the label
        written checked against the model's own favourite."""
        labels = self.cfg.labels
        missing = [x for x in labels if x not in found]
        if missing:
            raise TrajectoryInvalid("logprobs", f"step {n}: no log-probability for label(s) {missing}; does the "
                                                "upstream honour logprob_token_ids?")
        live = {x: lp for x, lp in found.items() if lp > MASKED_AT and math.isfinite(lp)}
        if not live:
            raise TrajectoryInvalid("logprobs", f"step {n}: every label is masked at the label position")
        top = max(live.values())
        weights = {x: (math.exp(live[x] - top) if x in live else 0.0) for x in labels}
        total = sum(weights.values())
        probs = {x: w / total for x, w in weights.items()}
        best = max(labels, key=lambda x: probs[x])
        if probs[label] < probs[best] - self.cfg.probability_tolerance:
            # The text says one label, the model's own probabilities another: not a decision to act on.
            raise TrajectoryInvalid("inconsistent", f"step {n}: the answer writes {label} (p={probs[label]:.4f}) "
                                                    f"but the log-probabilities favour {best} (p={probs[best]:.4f})")
        return {"step": n, "reasoningCode": code, "label": label, "probabilities": probs, "confidence": probs[best]}


class GeneratedMode:
    roomy: int | None = None  # max_tokens is already the bound

    def __init__(self, cfg: DecisionConfig):
        self.cfg = cfg
        schema = cfg.output_schema or derived_output_schema(cfg)
        system = (f"{cfg.instructions or DEFAULT_INSTRUCTIONS}\n"
                  f"Write the decision trajectory as one JSON document with exactly {cfg.steps} step(s): for each "
                  f"step its number, a reasoning code, the probability of each label, and a confidence.\n"
                  f"Trajectory JSON Schema:\n{json.dumps(schema, separators=(',', ':'))}\n")
        self._system = {"role": "system", "content": system}
        self._base: dict[str, Any] = {"model": cfg.upstream.served_model_name,
                                      "max_tokens": cfg.upstream.max_tokens or 1024}
        self.max_tokens: int = self._base["max_tokens"]
        self.max_answer_bytes = answer_bound(self._base["max_tokens"])
        if not cfg.diffusion:
            # Diffusion models in vLLM 0.26 reject structured outputs, seed and temperature != 1.0.
            self._base["temperature"] = 0.0
            self._base["structured_outputs"] = {"json": schema}

    def request(self, canonical: str, seed: int) -> dict[str, Any]:
        body = dict(self._base)
        body["messages"] = [self._system, {"role": "user", "content": canonical}]
        if not self.cfg.diffusion:
            body["seed"] = seed
        return body

    def parse(self, response: dict[str, Any], max_tokens: int | None = None) -> Any:
        """The answer's JSON document, whatever its shape: TrajectoryChecker.check says whether it is a trajectory.
        (`max_tokens` as ScoredMode.parse takes it: a `length` answer is never read here.)"""
        choice = check_choice(response, want_logprobs=False)
        if choice.get("finish_reason") == "length":
            raise TrajectoryInvalid("length", "the model hit max_tokens before finishing (finish_reason: length)")
        content = choice["message"].get("content")
        if not isinstance(content, str):
            raise TrajectoryInvalid("json", "the answer has no text content")
        try:
            # Strict: no lenient repair of a half-written document.
            return json.loads(content, parse_constant=reject_constant)
        except ValueError as exc:
            raise TrajectoryInvalid("json", f"the answer is not one JSON document: {exc}") from None


def _token_bytes(entry: dict[str, Any]) -> tuple[int, ...]:
    """A log-probability entry's token as bytes: vLLM sends `bytes`; a server without them, the token text."""
    b = entry.get("bytes")
    if isinstance(b, list):
        return tuple(b)
    return tuple(str(entry.get("token", "")).encode())


def _token_len(entry: dict[str, Any]) -> int:
    b = entry.get("bytes")
    if isinstance(b, list):
        return len(b)
    return len(str(entry.get("token", "")).encode())


class Decider:
    """Decides one input document. Shared by the V2 and the plain JSON endpoints."""

    def __init__(self, cfg: DecisionConfig, client: UpstreamClient, rules: RulesEngine, metrics: Metrics):
        self.cfg = cfg
        self.client = client
        self.rules = rules
        self.metrics = metrics
        self.checker = TrajectoryChecker(cfg)
        self.reserve = DeadlineReserve(cfg.deadline_s)
        self.mode: ScoredMode | GeneratedMode | None = None
        self._urls = tuple(url + "/chat/completions" for url in cfg.upstream.urls)
        self.engines = EnginePicker(self._urls)

    def load(self, tokens: LabelTokens | None) -> None:
        if self.cfg.trajectory_mode == "scored":
            assert tokens is not None
            self.mode = ScoredMode(self.cfg, tokens)
        else:
            self.mode = GeneratedMode(self.cfg)

    async def _call(self, body: dict[str, Any], timeout: float) -> Any:
        """The upstream's decoded answer, whatever its shape (check_choice names what is wrong with it)."""
        assert self.mode is not None
        engine = self.engines.pick()
        self.engines.in_flight[engine] += 1
        try:
            status, content = await self.client.post(self._urls[engine], body, timeout, self.mode.max_answer_bytes)
        finally:
            self.engines.in_flight[engine] -= 1
        if status >= 500 or status == 429:
            raise UpstreamFailure("http_5xx" if status >= 500 else "http_4xx", f"upstream answered {status}",
                                  retryable=True)
        if status != 200:
            # vLLM's refusal of a prompt longer than --max-model-len leaves (its 400 says "maximum context length"):
            # counted apart, because its fix is the spec's maxModelLen or the inputs, not the request's shape.
            kind = "context_length" if status == 400 and CONTEXT_LENGTH_REFUSAL in bytes(content[:2048]) else "http_4xx"
            raise UpstreamFailure(kind, f"upstream answered {status}: {content[:200]!r}", retryable=False)
        try:
            return loads(content)
        except (ValueError, RecursionError):
            raise UpstreamFailure("protocol", "upstream answered 200 with a body that is not JSON",
                                  retryable=True) from None

    async def _model(self, canonical: str, out: Outcome, budget_s: float) -> tuple[Any, str, float] | str:
        """Try the model within the attempts allowed; returns (trajectory, decision, confidence) or a reason."""
        assert self.mode is not None
        body = self.mode.request(canonical, derive_seed(self.cfg, canonical))
        reason = "invalid"
        started = time.perf_counter()
        for attempt in range(self.cfg.upstream.max_retries + 1):
            out.attempts = attempt + 1
            remaining = budget_s - (time.perf_counter() - started)
            if remaining <= 0:
                return "deadline"
            t0 = time.perf_counter()
            try:
                response = await self._call(body, remaining)
            except UpstreamFailure as failure:
                self.metrics.upstream_error(failure.kind)
                out.notes.append(str(failure))
                reason = {"connect": "upstream_down", "timeout": "deadline"}.get(failure.kind, "upstream_error")
                if not failure.retryable:
                    return reason
                if attempt < self.cfg.upstream.max_retries:
                    await asyncio.sleep(min(0.01 * 2 ** attempt, 0.2))
                continue
            finally:
                out.upstream_s += time.perf_counter() - t0
            try:
                trajectory = self.mode.parse(response, body.get("max_tokens"))
                self.checker.check(trajectory)
            except WireError as wrong:
                self.metrics.upstream_error("protocol")
                out.notes.append(f"attempt {attempt + 1}: {wrong}")
                reason = "upstream_error"
                continue
            except TrajectoryInvalid as invalid:
                self.metrics.violation(invalid.kind)
                out.notes.append(f"attempt {attempt + 1}: {invalid}")
                reason = "invalid"
                if invalid.kind == "length" and self.mode.roomy and body.get("max_tokens") != self.mode.roomy:
                    body = {**body, "max_tokens": self.mode.roomy}  # a name spelt in pieces: room to finish
                continue
            except Exception as exc:  # anything the wire check missed is still the upstream's fault
                self.metrics.upstream_error("protocol")
                out.notes.append(f"attempt {attempt + 1}: unreadable upstream answer ({type(exc).__name__})")
                reason = "upstream_error"
                continue
            decision, confidence = self.checker.decide(trajectory)
            return trajectory, decision, confidence
        return reason

    async def decide(self, document: Any, canonical: str | None = None, arrived: float | None = None) -> Outcome:
        """`arrived`: perf_counter() when the request arrived; the deadline counts from then, less the reserve the
        rules need, so a fallback answer leaves within deadlineMs of arrival."""
        canonical = canonical or canonical_json(document)
        out = Outcome(None, None, {}, "none", "error")
        waited = 0.0 if arrived is None else time.perf_counter() - arrived
        budget = self.cfg.deadline_s - waited - self.reserve.s
        try:
            if budget <= 0:
                raise TimeoutError
            # asyncio.timeout, not wait_for: no extra task per decision.
            async with asyncio.timeout(budget):
                result = await self._model(canonical, out, budget)
        except TimeoutError:
            self.metrics.upstream_error("timeout")
            out.notes.append(f"no valid answer within deadlineMs ({self.cfg.deadline_ms} ms)")
            result = "deadline"
        if isinstance(result, tuple):
            self.reserve.relax()
            trajectory, decision, confidence = result
            out.trajectory, out.decision, out.confidence, out.source = trajectory, decision, confidence, "model"
            if confidence >= self.cfg.confidence_threshold:
                out.outcome = "ok"
                return out
            if self.cfg.low_confidence_policy == "flag":
                out.outcome, out.flagged = "low_confidence", True
                return out
            reason = "low_confidence"
        else:
            reason = result
        return self._fallback(document, reason, out)

    def _fallback(self, document: Any, reason: str, out: Outcome) -> Outcome:
        self.metrics.fallback(reason)
        out.fallback_reason = reason
        model = ({"decision": out.decision, "confidence": out.confidence, "trajectory": out.trajectory}
                 if out.source == "model" else None)
        try:
            ruled = self.rules.decide(document, model, reason)
        except Exception as exc:  # the rules are total by construction; a defect must not cost the answer
            self.rules.eval_errors += 1
            out.notes.append(f"rules failed: {type(exc).__name__}")
            ruled = None
        if ruled is None:
            if out.source == "model":
                # Low confidence and no rule applies: the model's decision stands, flagged.
                out.outcome, out.flagged = "low_confidence", True
                out.notes.append("no fallback rule matched; the model's low-confidence decision is kept")
                return out
            out.outcome, out.source = "error", "none"
            out.error = f"no decision: the model could not decide ({reason}) and no fallback rule matched"
            return out
        model_trajectory = out.trajectory or None
        # A rule estimates no probability: confidence is null; source, rule and fallbackReason say what decided.
        out.decision, out.confidence, out.source, out.outcome = ruled.decision, None, "rules", "fallback"
        out.rule = ruled.rule
        out.flagged = False
        out.trajectory = {"rule": ruled.rule, "reasoningCode": ruled.reasoning_code, "fallbackReason": reason}
        if model_trajectory:
            out.trajectory["modelTrajectory"] = model_trajectory
        return out
