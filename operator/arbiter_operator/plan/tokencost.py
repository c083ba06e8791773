"""What a scored decision costs in generated tokens, read from the version's own tokenizer (`tokenizer.json`).

Every generated token is one forward pass of the model, so a decision's latency is about its generated tokens times
the time per token. In scored mode the model writes, per step, a reasoning code and a label (plus `:` and a line
end in the `lines` format) and then the end of sequence. With every label and code one token of the tokenizer
(also right after one another) a K-step decision costs 2K tokens in the compact format: the runtime ends generation
on the last label, sparing the forced end of sequence; otherwise the end of sequence is written too, and a name the
tokenizer splits into n tokens costs n-1 more per step it is written in. A label must be one token where it is
written (the runtime reads its probability from that token's log-probability and refuses a model whose labels are
not), a code may be several tokens at a cost. In the fused format each code immediately followed by each label is
one token (K tokens for K steps), or the runtime refuses the model.

Pure: the tokenizer text and the effective decision settings in, a `TokenCost` out. The count mirrors the
runtime's own check (arbiter_runtime.tokens.resolve): a label is counted after each code and the joiner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The answer format per scoredFormat: what stands between a code and its label, and after the label.
JOINER = {"compact": ("", ""), "lines": (":", "\n")}


class TokenizerUnreadable(ValueError):
    """tokenizer.json is not a tokenizer the `tokenizers` library can load."""


@dataclass(frozen=True)
class TokenCost:
    per_decision: int  # generated tokens of the longest well-formed scored answer (with the end of sequence if written)
    single_token: int  # the same with every label and code one token: what fine-tuning with added tokens gives
    multi_token: tuple[tuple[str, str, int], ...] = field(default_factory=tuple)  # (kind, name, tokens)

    @property
    def extra(self) -> int:
        return self.per_decision - self.single_token

    def message(self) -> str:
        if not self.multi_token:
            return (f"{self.per_decision} generated tokens per decision: every label and reasoning code is one token "
                    "of the model's tokenizer")
        shown = ", ".join(f"{kind} {name!r} is {n} tokens" for kind, name, n in self.multi_token[:4])
        more = f" and {len(self.multi_token) - 4} more" if len(self.multi_token) > 4 else ""
        kinds = {kind for kind, _, _ in self.multi_token}
        refused = ("; a label of several tokens cannot be scored (its probability is read from one token), so the "
                   "runtime refuses this model in scored mode" if "label" in kinds else
                   "; in scoredFormat fused each step is one pair token, so the runtime refuses this model"
                   if "pair" in kinds else "")
        return (f"{shown}{more}: a decision generates up to {self.per_decision} tokens instead of "
                f"{self.single_token} (+{self.extra} forward passes, about +{100 * self.extra // self.single_token}% "
                f"latency){refused}. Add each name as one token of the tokenizer when fine-tuning "
                "(tokenizer.add_tokens, then resize the model's embeddings), or choose names that are single tokens")


def _tokenizer(text: bytes) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text.decode("utf-8"))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # parse errors, and the Rust side's panics (pyo3 PanicException is a BaseException)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise TokenizerUnreadable(first) from None


def token_cost(tokenizer_json: bytes, labels: list[str], codes: list[str], steps: int,
               scored_format: str = "compact") -> TokenCost:
    """Raises TokenizerUnreadable when the file is not a tokenizer."""
    tok = _tokenizer(tokenizer_json)

    def n(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    if scored_format == "fused":
        # One token per step when every pair is one token (arbiter_runtime.tokens.resolve_pairs); otherwise the
        # runtime refuses the model, and the count is what the pieces would cost.
        pairs = {c + x: n(c + x) for c in codes for x in labels}
        multi = tuple(("pair", name, k) for name, k in pairs.items() if k > 1)
        return TokenCost(per_decision=steps * max(pairs.values()) + (1 if multi else 0), single_token=steps,
                         multi_token=multi)
    joiner, end = JOINER[scored_format]

    code_tokens = {c: n(c) for c in codes}
    sep = max(n(c + joiner) - code_tokens[c] for c in codes)
    label_tokens = {label: max(n(c + joiner + label) - n(c + joiner) for c in codes) for label in labels}
    tail = max(n(c + joiner + label + end) - n(c + joiner + label) for c in codes for label in labels)
    per_step = max(code_tokens.values()) + sep + max(label_tokens.values()) + tail
    ideal_step = 1 + sep + 1 + tail
    multi = tuple(("label", x, label_tokens[x]) for x in labels if label_tokens[x] > 1) + tuple(
        ("reasoning code", c, code_tokens[c]) for c in codes if code_tokens[c] > 1)
    if scored_format == "compact":
        # As the runtime decides (arbiter_runtime.tokens): with every name one token, also a code right after each
        # label, generation ends on the last label; the ideal is that count.
        whole = not multi and all(n(label + c) == 2 for label in labels for c in codes)
        return TokenCost(per_decision=2 * steps if whole else steps * per_step + 1, single_token=2 * steps,
                         multi_token=multi)
    return TokenCost(per_decision=steps * per_step + 1, single_token=steps * ideal_step + 1, multi_token=multi)


def decision_settings(decision: Any) -> dict[str, Any] | None:
    """labels, codes, steps and format from an effective `DecisionSpec`; None when the mode is not scored."""
    if decision.trajectoryMode != "scored":
        return None
    return {"labels": list(decision.labels), "codes": list(decision.reasoningCodes), "steps": decision.steps,
            "scored_format": decision.scoredFormat}
