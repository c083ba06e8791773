"""Resolve the token ids of labels (and codes) from the model's tokenizer at start-up.

Scored mode reads each label's probability from `logprob_token_ids` at the position where the label is written,
so each label must be exactly one token *in the context it is written in* (right after the code in the compact
scored format, after "code:" in the lines format). A label is therefore resolved by tokenizing "code" + joiner and
"code" + joiner + "label" and requiring the second to be the first plus one token; a model
whose labels do not pass, or whose labels share a token, is refused before the server reports ready.

In the compact format (no joiner) it also finds whether every code is one token too, on its own and right after
each label: then a well-formed answer is exactly one token per code and per label, 2K tokens for K steps, and the
runtime can end generation on the last label instead of spending a forward pass on the forced end of sequence
(`LabelTokens.single_token_steps`, used by decide.ScoredMode).

In the fused format each step is one token: the code and its label written together, a token a model fine-tuned with
every (code, label) pair added to its tokenizer writes in one forward pass (K tokens for K steps). Each pair's text
must then be exactly one token, and the labels' probabilities are read from the pair tokens of the code written
(`LabelTokens.pair_ids`).

Two sources give the same answer: the model directory's tokenizer.json (the `tokenizers` library, no network),
or the upstream's `/tokenize` endpoint, which `vllm serve` has (and so does the stand-in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .config import DecisionConfig
    from .upstream import UpstreamClient


class TokenizerRefused(RuntimeError):
    """The model cannot serve this config in scored mode; the message says why and what to change."""


class TokenSource(Protocol):
    async def encode(self, text: str) -> list[int]: ...


class TokenizerJsonSource:
    """tokenizer.json from a model directory (as `vllm serve MODEL_DIR` loads it)."""

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer  # only needed on this path

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerRefused(f"no tokenizer.json in model directory {model_dir}; pass the directory that "
                                   "vllm serve loads, or leave --model-dir out to ask the upstream's /tokenize")
        self._tok = Tokenizer.from_file(str(path))
        self.description = str(path)

    async def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


class UpstreamTokenizeSource:
    """vLLM's `POST /tokenize` (served at the root, beside /v1)."""

    def __init__(self, client: UpstreamClient, base_url: str, model: str):
        """`client`: an upstream.UpstreamClient (started)."""
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self._url = root + "/tokenize"
        self._client = client
        self._model = model
        self.description = self._url

    async def encode(self, text: str) -> list[int]:
        status, content = await self._client.post(self._url, {"model": self._model, "prompt": text,
                                                               "add_special_tokens": False}, timeout=30.0,
                                                  max_bytes=1 << 20)  # the ids of one label's text: a few bytes
        if status != 200:
            raise TokenizerRefused(f"{self._url} answered {status}: {content[:200]!r}")
        body = json.loads(content)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise TokenizerRefused(f"{self._url} answered without a 'tokens' list")
        return [int(t) for t in tokens]


@dataclass(frozen=True)
class LabelTokens:
    label_ids: dict[str, int]
    code_ids: dict[str, list[int]]
    source: str
    # Every code and label is one token wherever the compact format writes it (after a label, after a code); in the
    # fused format, every step is one token.
    single_token_steps: bool = False
    # The fused format: (code, label) -> the one token that writes both (empty in the other formats).
    pair_ids: dict[tuple[str, str], int] = field(default_factory=dict)


async def resolve_for(source: TokenSource, cfg: DecisionConfig, description: str = "") -> LabelTokens:
    """The token ids a decision config's scored format reads (`resolve`, or `resolve_pairs` for fused)."""
    if cfg.scored_format == "fused":
        return await resolve_pairs(source, cfg.labels, cfg.reasoning_codes, description)
    return await resolve(source, cfg.labels, cfg.reasoning_codes, description, cfg.label_joiner)


async def resolve_pairs(source: TokenSource, labels: tuple[str, ...], codes: tuple[str, ...],
                        description: str = "") -> LabelTokens:
    """The fused format: every code immediately followed by every label must be exactly one token, all distinct.
    Only the pair's own token matters (the model writes ids; vLLM turns each back into its text), so no context is
    checked. A model whose pairs are not single tokens is refused before the server reports ready. (How many pairs
    vLLM can return is the config's check: scored_format.FusedFormat.)"""
    pair_ids: dict[tuple[str, str], int] = {}
    pieces: list[str] = []
    for code in codes:
        for label in labels:
            ids = await source.encode(code + label)
            if len(ids) == 1:
                pair_ids[(code, label)] = ids[0]
            else:
                pieces.append(f"{code + label!r} is {len(ids)} tokens")
    if pieces:
        shown = "; ".join(pieces[:4]) + (f" and {len(pieces) - 4} more" if len(pieces) > 4 else "")
        raise TokenizerRefused(
            "this model cannot run in scoredFormat fused: each reasoning code immediately followed by each label must "
            f"be exactly one token of the tokenizer; {shown}. Add every pair as one token when fine-tuning "
            "(tokenizer.add_tokens, then resize the model's embeddings), or use scoredFormat: compact")
    by_id: dict[int, list[str]] = {}
    for (code, label), tid in pair_ids.items():
        by_id.setdefault(tid, []).append(code + label)
    shared = [names for names in by_id.values() if len(names) > 1]
    if shared:
        raise TokenizerRefused(f"this model cannot run in scoredFormat fused: pairs {shared} map to the same token")
    # The labels' and codes' own ids are not what this format writes: only the pairs are requested.
    return LabelTokens(label_ids={}, code_ids={}, source=description, single_token_steps=True, pair_ids=pair_ids)


async def resolve(source: TokenSource, labels: tuple[str, ...], codes: tuple[str, ...],
                  description: str = "", joiner: str = ":") -> LabelTokens:
    """`joiner`: what stands between a code and its label (DecisionConfig.label_joiner)."""
    label_ids: dict[str, int] = {}
    problems: list[str] = []
    for label in labels:
        seen: set[int] = set()
        for code in codes:
            prefix = await source.encode(f"{code}{joiner}")
            full = await source.encode(f"{code}{joiner}{label}")
            if len(full) != len(prefix) + 1 or full[:len(prefix)] != prefix:
                problems.append(f"label {label!r} after {code + joiner!r} tokenizes as {len(full) - len(prefix)} "
                                f"tokens ({full[len(prefix):] if full[:len(prefix)] == prefix else full})")
                break
            seen.add(full[-1])
        else:
            if len(seen) != 1:
                problems.append(f"label {label!r} maps to different tokens {sorted(seen)} depending on the code")
            else:
                label_ids[label] = seen.pop()
    if problems:
        raise TokenizerRefused(
            "this model cannot run in scored mode: each label must be exactly one token where it is written; "
            + "; ".join(problems) + ". Choose labels that are single tokens of this tokenizer (short words or "
            "letters), or use trajectoryMode: generated")
    by_id: dict[int, list[str]] = {}
    for label, tid in label_ids.items():
        by_id.setdefault(tid, []).append(label)
    shared = [names for names in by_id.values() if len(names) > 1]
    if shared:
        raise TokenizerRefused(f"this model cannot run in scored mode: labels {shared} map to the same token; "
                               "choose labels that are distinct tokens")
    code_ids = {code: await source.encode(code) for code in codes}
    single = joiner == "" and await _codes_single_after_labels(source, label_ids, code_ids)
    return LabelTokens(label_ids=label_ids, code_ids=code_ids, source=description, single_token_steps=single)


async def _codes_single_after_labels(source: TokenSource, label_ids: dict[str, int],
                                     code_ids: dict[str, list[int]]) -> bool:
    """Whether each code is one token on its own and stays that token right after every label (a label's own
    context, after a code, was checked by `resolve`)."""
    if any(len(ids) != 1 for ids in code_ids.values()):
        return False
    for label, label_id in label_ids.items():
        for code, ids in code_ids.items():
            if await source.encode(f"{label}{code}") != [label_id, ids[0]]:
                return False
    return True


def describe(tokens: LabelTokens) -> str:
    # endsOnLastLabel: whether the compact answer asks for exactly 2K tokens (decide.ScoredMode), said at start-up.
    if tokens.pair_ids:
        return json.dumps({"pairTokenIds": {c + x: tid for (c, x), tid in tokens.pair_ids.items()},
                           "source": tokens.source, "endsOnLastLabel": True})
    return json.dumps({"labelTokenIds": tokens.label_ids, "source": tokens.source,
                       "endsOnLastLabel": tokens.single_token_steps})


