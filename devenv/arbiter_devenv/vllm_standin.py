"""Stand-in for `vllm serve` (vLLM 0.26) where no GPU is: tests, benchmarks, the GPU-less local run.

It speaks the OpenAI chat-completions wire format the way vLLM 0.26 answers it, for every answer format the runtime
asks for (scored compact and lines regexes, generated JSON) (as a
recorded vLLM 0.26 scored answer shows): `structured_outputs` {regex, choice, json} (the removed `guided_json` is
ignored, as vLLM ignores it), `logprobs`/`top_logprobs`, `logprob_token_ids` (the sampled token first, then the
requested ids; tokens the constraint masks come back at -9999.0), `seed`, `max_tokens` (-> finish_reason
"length"), `/tokenize`, `/health`, `/v1/models`.

The "model" is a real tokenizer (built with `tokenizers`, saved as tokenizer.json so the runtime can read it from a
model directory) and deterministic pseudo-logits derived from the prompt, the seed and the text so far; regex and
choice constraints are enforced token by token with partial regex matching, as a grammar backend masks logits.
A JSON-schema constraint is honoured for trajectory-shaped schemas (the runtime's), standing in for a fine-tuned
model that writes trajectories.

Behaviours, set with `--behaviour` or `POST /standin/behaviour`: valid, invalid (ignores the constraint / writes
probabilities that do not sum to 1), truncated (stops at max_tokens with finish_reason length), slow (waits
`delay_s` first), failing (HTTP 500); with `distribution` (label -> probability at label positions) and `keyed_by`
("case": the answer depends on the case alone, so two model versions agree) and `spread` (how confident). "down" is
a stopped server (StandinServer.stop()), because a running server cannot refuse connections.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import math
import os
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MASKED = -9999.0  # what vLLM's JSON carries for a -inf (masked) log-probability
EOS = "<eos>"
DEFAULT_WORDS = ("approve", "deny", "review", "A", "R", "ok")


def build_tokenizer(words: tuple[str, ...] | list[str] = DEFAULT_WORDS, added: bool = False):
    """A small BPE tokenizer: every printable ASCII character is a token, each word is one token. `added`: the words
    are also added tokens (as fine-tuning with `tokenizer.add_tokens` makes them), so each stays one token wherever it
    stands, e.g. right after another word; without it a word written after another may merge into other pieces."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab: dict[str, int] = {EOS: 0, "<unk>": 1}
    for c in [chr(c) for c in range(32, 127)] + ["\n"]:
        vocab.setdefault(c, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in words:
        cur = word[0]
        for ch in word[1:]:
            nxt = cur + ch
            if nxt not in vocab:
                vocab[nxt] = len(vocab)
                merges.append((cur, ch))
            cur = nxt
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    # Words never merge across punctuation or spaces, like most real pre-tokenizers.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[A-Za-z0-9_]+|[^A-Za-z0-9_]"), "isolated")
    tok.decoder = decoders.Fuse()
    if added:
        tok.add_tokens([AddedToken(w, normalized=False, special=False) for w in words])
    return tok


def write_model_dir(path: str | Path, words=DEFAULT_WORDS, served_name: str = "standin", added: bool = False) -> Path:
    """A model directory as `vllm serve DIR` would read it (tokenizer.json + config.json)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(words, added).save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps({"architectures": ["StandinForCausalLM"], "model_type": "standin",
                                                  "_name_or_path": served_name}))
    return path


@dataclass
class Behaviour:
    mode: str = "valid"  # valid | invalid | truncated | slow | failing
    delay_s: float = 0.0
    count: int | None = None  # apply to this many completions, then return to the default
    distribution: dict[str, float] | None = None  # label text -> probability at label positions
    # What the "weights" see: "request" (the whole prompt and the seed, which the runtime derives from the model
    # version too: two versions decide differently) or "case" (the user message alone: two versions of a model with
    # the same labels decide every case alike, as a retrained champion and its challenger mostly do).
    keyed_by: str = "request"
    spread: float = 3.0  # how far apart the pseudo-logits lie: larger, more confident answers
    # This share of cases (by the user message, so a retry of the same case fails too) gets HTTP 500: a version whose
    # model fails on part of its inputs, so the rules decide that share of decisions.
    fail_share: float = 0.0
    # Engine limits, as `vllm serve` has them (None: unlimited, as before). max_num_seqs: requests beyond it wait for a
    # slot (vllm:num_requests_waiting, queue time); kv_per_seq: the share of the KV cache one running request holds,
    # a request admitted past a full cache preempts one (vllm:num_preemptions_total) and pays a recompute;
    # max_model_len: a prompt that leaves no room for max_tokens is refused with vLLM's 400.
    max_num_seqs: int | None = None
    kv_per_seq: float | None = None
    max_model_len: int | None = None
    # A trained model's answer, step by step: [(code, {label: probability}), ...]. At a code position the step's code
    # is written, at a label position its distribution holds (a distribution above is the same at every step).
    plan: list | None = None


@dataclass
class Usage:
    """What vLLM's /metrics counts of the completions served (the families a benchmark reads tokens and forward
    passes from). The stand-in decodes one token per step, so each completion is one first token (time to first
    token) and one inter-token interval per further token, as vLLM counts them without speculative decoding."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    seconds: float = 0.0  # summed time of the completions

    def add(self, prompt_tokens: int, generated: int, finish: str, seconds: float) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        self.finished[finish] = self.finished.get(finish, 0) + 1
        self.seconds += seconds

    @property
    def requests(self) -> int:
        return sum(self.finished.values())

    def exposition(self, name: str) -> str:
        labels = f'engine="0",model_name="{name}"'
        n, gen = self.requests, self.generation_tokens
        per_token = self.seconds / gen if gen else 0.0
        lines = [
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {float(gen)}",
        ]
        for family, count, total in (
                ("vllm:time_to_first_token_seconds", n, per_token * n),
                ("vllm:inter_token_latency_seconds", gen - n, per_token * (gen - n)),
                ("vllm:e2e_request_latency_seconds", n, self.seconds),
                ("vllm:request_generation_tokens", n, float(gen))):
            lines += [f"# HELP {family} Histogram.", f"# TYPE {family} histogram",
                      f'{family}_bucket{{{labels},le="+Inf"}} {float(count)}',
                      f"{family}_count{{{labels}}} {float(count)}", f"{family}_sum{{{labels}}} {total}"]
        return "\n".join(lines) + "\n"


@dataclass
class StandinState:
    tokenizer: Any
    served_model_name: str
    default: Behaviour = field(default_factory=Behaviour)
    queued: list[Behaviour] = field(default_factory=list)
    reject_structured: bool = False  # a diffusion model: 400 on structured_outputs / seed
    # In-process only: the case (the user message) -> a plan (Behaviour.plan), a "model" whose answers follow rules
    # (the local run's example model, arbiter_devenv.example_model); None: no plan, or the behaviour's.
    planner: Any = None
    requests: list[dict] = field(default_factory=list)  # last requests, for tests to inspect
    completions: int = 0
    usage: Usage = field(default_factory=Usage)
    # The whole words of the vocabulary (labels, codes): the "model" prefers them over the pieces that spell them,
    # as a model fine-tuned on its tokenizer's canonical tokens does (under a compact-format regex the pieces of a
    # code are allowed too, and each would cost a forward pass).
    words: frozenset = frozenset()
    # What vLLM's own metrics count (metrics() below): engine occupancy, preemptions, queue waits, prompt sizes and
    # how requests finished.
    running: int = 0
    waiting: int = 0
    preemptions: int = 0
    queue_waits: list = field(default_factory=list)  # seconds each admitted request waited, the last 10,000
    prompt_sizes: list = field(default_factory=list)  # prompt tokens of each answered request, the last 10,000
    finished: dict = field(default_factory=dict)  # finished_reason -> answered requests

    def __post_init__(self):
        vocab = self.tokenizer.get_vocab()
        self.id_to_text = {i: t for t, i in vocab.items()}
        self.text_to_id = vocab
        self.eos_id = vocab[EOS]
        self.ordinary = sorted(i for i, t in self.id_to_text.items() if t not in (EOS, "<unk>"))

    def next_behaviour(self) -> Behaviour:
        if self.queued:
            b = self.queued[0]
            if b.count is not None:
                b.count -= 1
                if b.count <= 0:
                    self.queued.pop(0)
            return b
        return self.default


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts (the stand-in's 'weights')."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2 ** 64


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str):
    return regex.compile(pattern, regex.DOTALL)


class Generator:
    def __init__(self, state: StandinState):
        self.s = state
        self._tokens = tuple((i, state.id_to_text[i]) for i in state.ordinary)
        self._word_ids = frozenset(state.text_to_id[w] for w in state.words if w in state.text_to_id)
        # A word's canonical token is the whole word; BPE's intermediate merges ("den" on the way to "deny") are
        # tokens a trained model rarely writes, so they get no preference.
        texts = [t for _, t in self._tokens]
        self._whole = frozenset(t for t in texts if len(t) > 1 and not any(o != t and o.startswith(t) for o in texts))
        self._allowed_cache: dict[tuple[str, str], tuple[tuple[int, ...], bool]] = {}

    def _allowed(self, pattern: str, prefix: str) -> tuple[tuple[int, ...], bool]:
        """Token ids that keep `prefix` inside the regex language, and whether `prefix` is already complete."""
        hit = self._allowed_cache.get((pattern, prefix))
        if hit is None:
            rx = _compiled(pattern)
            ok = tuple(i for i, text in self._tokens if rx.fullmatch(prefix + text, partial=True))
            hit = (ok, rx.fullmatch(prefix) is not None)
            if len(self._allowed_cache) > 20000:
                self._allowed_cache.clear()
            self._allowed_cache[(pattern, prefix)] = hit
        return hit

    def constrained(self, pattern: str | None, key: str, max_tokens: int, greedy: bool, rng: random.Random,
                    dist: dict[str, float] | None, want: list[int] | None, top_n: int | None,
                    spread: float = 3.0, plan: list | None = None):
        """Token-by-token decoding under a regex, as a grammar backend masks logits. Returns text, entries, finish.
        With a plan, the step (the labels written so far) picks the code to write and the labels' distribution."""
        text = ""
        entries = []
        plan_labels = frozenset(label for _, step in plan or [] for label in step)
        written = 0  # labels written so far: the step the plan is at
        for position in range(max_tokens):
            boost = None
            if plan:
                code, dist = plan[min(written, len(plan) - 1)]
                boost = self.s.text_to_id.get(code)
            if pattern is None:
                allowed, complete = tuple(i for i, _ in self._tokens), position > 0 and _unit(key, text) < 0.02
            else:
                allowed, complete = self._allowed(pattern, text)
            logits: dict[int, float] = {}
            for tid in allowed:
                tok = self.s.id_to_text[tid]
                if dist and tok in dist:
                    logits[tid] = math.log(max(dist[tok], 1e-12))
                else:
                    # Whole words outrank single characters, as a trained model prefers its canonical tokens. A
                    # wider spread between words (more confident answers) keeps the pieces below every word.
                    word = tid in self._word_ids
                    logits[tid] = -(spread if word else 3.0) * _unit(key, text, tid) \
                        - (0.0 if dist is None else 6.0) - (0.0 if word else max(0.0, spread - 3.0)) \
                        + (4.0 if tok in self._whole else 0.0) + (3.0 if word else 0.0)
            if boost in logits:
                logits[boost] += 12.0  # the model writes the step's code
            if complete:
                logits[self.s.eos_id] = 5.0 if not allowed else -1.0
            if not logits:  # dead end: a regex the vocabulary cannot finish
                break
            top = max(logits.values())
            norm = top + math.log(sum(math.exp(v - top) for v in logits.values()))
            logprobs = {tid: v - norm for tid, v in logits.items()}
            if greedy:
                chosen = max(logprobs, key=lambda t: (logprobs[t], -t))
            else:
                r, acc = rng.random(), 0.0
                chosen = next(iter(logprobs))
                for tid, lp in logprobs.items():
                    acc += math.exp(lp)
                    if r < acc:
                        chosen = tid
                        break
            entries.append(self._entry(chosen, logprobs, want, top_n))
            if chosen == self.s.eos_id:
                return text, entries, "stop"
            text += self.s.id_to_text[chosen]
            written += self.s.id_to_text[chosen] in plan_labels
        return text, entries, "length"

    def _lp(self, tid: int, logprobs: dict[int, float]) -> float:
        return logprobs.get(tid, MASKED)

    def _one(self, tid: int, logprobs) -> dict:
        text = self.s.id_to_text.get(tid, "")
        return {"token": text, "logprob": self._lp(tid, logprobs), "bytes": list(text.encode())}

    def _entry(self, chosen: int, logprobs: dict[int, float], want: list[int] | None, top_n: int | None) -> dict:
        entry = self._one(chosen, logprobs)
        if want:
            # vLLM 0.26: the sampled token, then the requested ids (once each), masked ones at -9999.0
            top = [self._one(chosen, logprobs)] + [self._one(t, logprobs) for t in dict.fromkeys(want) if t != chosen]
        elif top_n:
            ranked = sorted(logprobs, key=lambda t: -logprobs[t])[:top_n]
            top = [self._one(t, logprobs) for t in ranked]
        else:
            top = []
        entry["top_logprobs"] = top
        return entry


def _trajectory_from_schema(schema: dict) -> tuple[int, list[str], list[str]] | None:
    try:
        steps = schema["properties"]["steps"]
        k = int(steps["minItems"])
        item = steps["items"]["properties"]
        return k, list(item["probabilities"]["required"]), list(item["reasoningCode"]["enum"])
    except (KeyError, TypeError, ValueError):
        return None


def _schema_in_prompt(messages: list[dict]) -> dict | None:
    """A fine-tuned model knows the runtime's prompt: the schema follows a 'Trajectory JSON Schema:' line."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str) and "Trajectory JSON Schema:\n" in content:
            try:
                return json.loads(content.split("Trajectory JSON Schema:\n", 1)[1].split("\n", 1)[0])
            except ValueError:
                return None
    return None


def _trajectory_doc(shape, key: str, dist: dict[str, float] | None, invalid: bool) -> str:
    k, labels, codes = shape
    steps = []
    for n in range(1, k + 1):
        if dist:
            raw = [max(dist.get(label, 0.0), 0.0) for label in labels]
        else:
            raw = [0.05 + _unit(key, n, label) for label in labels]
        total = sum(raw) or 1.0
        probs = [round(v / total, 4) for v in raw]
        probs[-1] = round(1.0 - sum(probs[:-1]), 4)
        if invalid:
            probs = [round(p / 2, 4) for p in probs]  # each in [0, 1], the sum 0.5: only the sum check catches it
        best = max(range(len(labels)), key=lambda i: probs[i])
        steps.append({"step": n, "reasoningCode": codes[int(_unit(key, n, "code") * len(codes))],
                      "label": labels[best], "probabilities": dict(zip(labels, probs, strict=True)),
                      "confidence": probs[best]})
    return json.dumps({"steps": steps})


def _error(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": status}},
                        status_code=status)


DEFAULT_MAX_MODEL_LEN = 4096
# vLLM's bucket bounds for queue time (seconds; the first one kept from before, so an idle engine reads ~10 ms) and
# its 1-2-5 series for prompt tokens (up to max_model_len).
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0)


def _opt(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def _prompt_buckets(max_model_len: int) -> list[int]:
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


def _context_refusal(state: StandinState, body: dict, behaviour: Behaviour) -> JSONResponse | None:
    """vLLM's 400 for a prompt that leaves no room for max_tokens within --max-model-len."""
    if not behaviour.max_model_len or not isinstance(body.get("messages"), list):
        return None
    prompt = len(state.tokenizer.encode(json.dumps(body["messages"], sort_keys=True), add_special_tokens=False).ids)
    wanted = int(body.get("max_tokens") or 256)
    if prompt + wanted <= behaviour.max_model_len:
        return None
    return _error(400, f"This model's maximum context length is {behaviour.max_model_len} tokens. However, you "
                  f"requested {prompt + wanted} tokens ({prompt} in the messages, {wanted} in the completion). "
                  "Please reduce the length of the messages or completion.")


async def _admit(state: StandinState, behaviour: Behaviour) -> None:
    """Wait for one of max_num_seqs slots (as vLLM's scheduler does); a slot taken past a full KV cache preempts."""
    arrived = time.monotonic()
    state.waiting += 1
    try:
        while state.running >= behaviour.max_num_seqs:
            await asyncio.sleep(0.005)
    finally:
        state.waiting -= 1
    state.running += 1
    state.queue_waits.append(time.monotonic() - arrived)
    if behaviour.kv_per_seq and state.running * behaviour.kv_per_seq > 1.0:
        state.preemptions += 1
        await asyncio.sleep(0.05)  # the preempted sequence is recomputed


def _histogram(name: str, labels: str, bounds: Any, values: list) -> str:
    lines = [f"# TYPE {name} histogram\n"]
    for bound in bounds:
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {sum(1 for v in values if v <= bound)}\n')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {len(values)}\n')
    lines.append(f"{name}_count{{{labels}}} {len(values)}\n{name}_sum{{{labels}}} {float(sum(values))}\n")
    return "".join(lines)


def _engine_metrics(state: StandinState, name: str) -> str:
    """vLLM 0.26's engine families, from what this stand-in served (names, types and labels as vLLM has them)."""
    labels = f'engine="0",model_name="{name}"'
    b = state.default
    # Without an engine model, a cache that fills with use but keeps room (at most half), as a healthy engine has.
    kv = min(1.0, state.running * b.kv_per_seq) if b.kv_per_seq else min(0.5, state.completions / 1000)
    text = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv:.4f}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {float(state.waiting)}\n"
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {float(state.running)}\n"
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        f"vllm:num_preemptions_total{{{labels}}} {float(state.preemptions)}\n"
        "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        "# TYPE vllm:request_success_total counter\n"
    )
    for reason in ("stop", "length", "abort"):
        count = float(state.finished.get(reason, 0))
        text += f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {count}\n'
    text += "# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.\n"
    text += _histogram("vllm:request_queue_time_seconds", labels, QUEUE_BUCKETS, state.queue_waits)
    text += "# HELP vllm:request_prompt_tokens Number of prefill tokens processed.\n"
    text += _histogram("vllm:request_prompt_tokens", labels,
                       _prompt_buckets(b.max_model_len or DEFAULT_MAX_MODEL_LEN), state.prompt_sizes)
    return text


def build_app(state: StandinState) -> Starlette:
    gen = Generator(state)

    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be an object")
        state.requests.append(body)
        del state.requests[:-50]
        behaviour = state.next_behaviour()
        refusal = _context_refusal(state, body, behaviour)
        if refusal is not None:
            return refusal
        if not behaviour.max_num_seqs:
            state.queue_waits.append(0.0)
            return await answer(body, behaviour)
        await _admit(state, behaviour)
        try:
            return await answer(body, behaviour)
        finally:
            state.running -= 1

    async def answer(body: dict, behaviour: Behaviour) -> Response:
        started = time.perf_counter()  # after any wait for a slot: the usage counts the engine's time, not the queue's
        if behaviour.mode in ("slow",) or behaviour.delay_s:
            await asyncio.sleep(behaviour.delay_s or 1.0)
        if behaviour.mode == "failing":
            return _error(500, "stand-in: injected failure", "InternalServerError")
        if body.get("model") != state.served_model_name:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages: field required", param="messages")
        so = body.get("structured_outputs") or {}
        if state.reject_structured and (so or body.get("seed") is not None):
            return _error(400, "diffusion models do not support structured outputs or seed")
        prompt = json.dumps(messages, sort_keys=True)
        seed = body.get("seed")
        if behaviour.keyed_by == "case":
            case = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            key = hashlib.sha256(json.dumps(case).encode()).hexdigest()[:16]
        else:
            key = hashlib.sha256(f"{prompt}|{seed}".encode()).hexdigest()[:16]
        if behaviour.fail_share:
            case = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            draw = int(hashlib.sha256(json.dumps(case).encode()).hexdigest()[:8], 16) / 0x100000000
            if draw < behaviour.fail_share:
                return _error(500, "stand-in: injected failure on this case", "InternalServerError")
        temperature = body.get("temperature", 1.0)
        greedy = temperature == 0
        rng = random.Random(seed if seed is not None else secrets.randbits(32))
        max_tokens = int(body.get("max_tokens") or 256)
        want = body.get("logprob_token_ids") if body.get("logprobs") else None
        top_n = body.get("top_logprobs") if body.get("logprobs") and not want else None
        invalid = behaviour.mode == "invalid"
        dist = behaviour.distribution

        shape = _trajectory_from_schema(so["json"]) if isinstance(so.get("json"), dict) else None
        if shape is None and not so:
            shape = (lambda s: _trajectory_from_schema(s) if s else None)(_schema_in_prompt(messages))
        if shape is not None:
            # "A fine-tuned model" writes the trajectory document; max_tokens still bounds it.
            content = _trajectory_doc(shape, key if not (not greedy and seed is None) else secrets.token_hex(4),
                                      dist, invalid)
            ids = state.tokenizer.encode(content, add_special_tokens=False).ids
            finish = "stop"
            if behaviour.mode == "truncated" or len(ids) > max_tokens:
                ids = ids[:min(max_tokens, max(1, len(ids) // 2))] if behaviour.mode == "truncated" else \
                    ids[:max_tokens]
                content = state.tokenizer.decode(ids)
                finish = "length"
            entries = [gen._entry(t, {t: 0.0}, want, top_n) for t in ids] if body.get("logprobs") else None
            completion_tokens = len(ids)
        else:
            pattern = None
            if isinstance(so.get("regex"), str):
                pattern = so["regex"]
            elif isinstance(so.get("choice"), list):
                pattern = "|".join(regex.escape(str(c)) for c in so["choice"])
            if invalid:
                pattern = None  # as if the constraint were not applied
            if behaviour.mode == "truncated":
                max_tokens = max(1, min(max_tokens, 3))
            if pattern is None and invalid:
                content, entries, finish = "maybe\n", [gen._one(state.text_to_id.get(c, 1), {})
                                                       | {"top_logprobs": []} for c in "maybe\n"], "stop"
            else:
                plan = state.planner(messages) if state.planner is not None else behaviour.plan
                content, entries, finish = gen.constrained(pattern, key, max_tokens, greedy, rng, dist, want, top_n,
                                                           behaviour.spread, plan)
            completion_tokens = len(entries)
        prompt_tokens = len(state.tokenizer.encode(prompt, add_special_tokens=False).ids)
        state.completions += 1
        state.prompt_sizes.append(prompt_tokens)
        state.finished[finish] = state.finished.get(finish, 0) + 1
        del state.prompt_sizes[:-10000], state.queue_waits[:-10000]
        state.usage.add(prompt_tokens, completion_tokens, finish, time.perf_counter() - started)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": {"content": entries} if body.get("logprobs") else None,
            "finish_reason": finish, "stop_reason": None, "token_ids": None, "routed_experts": None,
        }
        return JSONResponse({
            "id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": int(time.time()),
            "model": state.served_model_name, "choices": [choice], "service_tier": None,
            "system_fingerprint": "vllm-0.26.0-standin",
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens": completion_tokens, "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        })

    async def tokenize(request: Request) -> Response:
        try:
            body = await request.json()
            text = body["prompt"]
            assert isinstance(text, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            return _error(400, "tokenize: 'prompt' (a string) is required", param="prompt")
        ids = state.tokenizer.encode(text, add_special_tokens=bool(body.get("add_special_tokens", True))).ids
        return JSONResponse({"count": len(ids), "max_model_len": state.default.max_model_len or DEFAULT_MAX_MODEL_LEN,
                             "tokens": list(ids), "token_strs": None})

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def metrics(_: Request) -> Response:
        # vLLM's Prometheus families the runtime re-exports (names and types as vLLM 0.26 serves them), next to the
        # Python collector families vLLM also serves and the runtime leaves out. Counts follow what was served.
        name = state.served_model_name
        text = (
            "# HELP python_gc_objects_collected_total Objects collected during gc\n"
            "# TYPE python_gc_objects_collected_total counter\n"
            'python_gc_objects_collected_total{generation="0"} 1.0\n'
            + _engine_metrics(state, name)
            + state.usage.exposition(name)
        )
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": state.served_model_name, "object": "model",
                                                         "owned_by": "vllm",
                                                         "max_model_len": state.default.max_model_len
                                                         or DEFAULT_MAX_MODEL_LEN}]})

    async def set_behaviour(request: Request) -> Response:
        body = await request.json()
        b = Behaviour(mode=body.get("mode", "valid"), delay_s=float(body.get("delay_s", 0.0)),
                      count=body.get("count"), distribution=body.get("distribution"),
                      keyed_by=body.get("keyed_by", "request"), spread=float(body.get("spread", 3.0)),
                      fail_share=float(body.get("fail_share", 0.0)),
                      max_num_seqs=_opt(body.get("max_num_seqs"), int), kv_per_seq=_opt(body.get("kv_per_seq"), float),
                      max_model_len=_opt(body.get("max_model_len"), int))
        if b.mode not in ("valid", "invalid", "truncated", "slow", "failing"):
            return _error(400, f"unknown behaviour {b.mode!r}")
        if b.keyed_by not in ("request", "case"):
            return _error(400, f"unknown keyed_by {b.keyed_by!r}: request or case")
        if b.count is None:
            state.default, state.queued = b, []
        else:
            state.queued.append(b)
        return JSONResponse({"ok": True})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/standin/behaviour", set_behaviour, methods=["POST"]),
    ])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandinServer:
    """Runs the stand-in in a background thread (tests); `stop()` makes it 'down'."""

    def __init__(self, words=DEFAULT_WORDS, served_model_name: str = "standin", port: int | None = None,
                 behaviour: Behaviour | None = None, reject_structured: bool = False, planner: Any = None,
                 added_tokens: bool = False):
        self.state = StandinState(tokenizer=build_tokenizer(words, added_tokens), served_model_name=served_model_name,
                                  default=behaviour or Behaviour(), reject_structured=reject_structured,
                                  words=frozenset(words), planner=planner)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._server = None
        self._thread = None

    def start(self) -> StandinServer:
        import uvicorn

        config = uvicorn.Config(build_app(self.state), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("stand-in upstream did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server = None

    def set(self, mode: str = "valid", delay_s: float = 0.0, count: int | None = None,
            distribution: dict[str, float] | None = None, keyed_by: str = "request", spread: float = 3.0) -> None:
        b = Behaviour(mode, delay_s, count, distribution, keyed_by, spread)
        if count is None:
            self.state.default, self.state.queued = b, []
        else:
            self.state.queued.append(b)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m arbiter_devenv.vllm_standin",
                                description="Stand-in for vllm serve (OpenAI wire format of vLLM 0.26)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--served-model-name", default="standin")
    p.add_argument("--words", default=",".join(DEFAULT_WORDS),
                   help="comma-separated words that are single tokens (put the labels here)")
    p.add_argument("--model-dir", help="also write tokenizer.json + config.json here, as a model directory")
    p.add_argument("--behaviour", default="valid", choices=["valid", "invalid", "truncated", "slow", "failing"])
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--keyed-by", default="request", choices=["request", "case"],
                   help="case: answers depend on the case alone, so two versions of a model agree")
    p.add_argument("--diffusion", action="store_true", help="reject structured_outputs and seed (400)")
    p.add_argument("--added-tokens", action="store_true",
                   help="the words are added tokens: one token wherever they stand (a fine-tuned tokenizer)")
    # vLLM's own flag, accepted as vLLM accepts it (the runtime's supervisor passes it); the stand-in logs no access.
    p.add_argument("--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction, default=False)
    args = p.parse_args(argv)
    words = tuple(w for w in args.words.split(",") if w)
    if args.model_dir:
        write_model_dir(args.model_dir, words, args.served_model_name, args.added_tokens)
    state = StandinState(tokenizer=build_tokenizer(words, args.added_tokens), served_model_name=args.served_model_name,
                         default=Behaviour(args.behaviour, args.delay_s, keyed_by=args.keyed_by),
                         reject_structured=args.diffusion,
                         words=frozenset(words))
    loop = "uvloop" if _has("uvloop") else "asyncio"
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level="warning", lifespan="off", loop=loop,
                http="httptools" if _has("httptools") else "h11", access_log=False)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main(os.sys.argv[1:])
