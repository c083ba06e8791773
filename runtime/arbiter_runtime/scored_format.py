"""What the model writes in scored mode, and how the runtime reads it back (`scoredFormat` in decision.json).

Every generated token costs one forward pass, so the format decides the latency of a decision:

- `compact` (default): per step the reasoning code, then the label, with nothing between them and nothing between
  steps, e.g. `INCOME_OKapprovedDTI_HIGHrejected`. With single-token codes and labels the model generates 2K tokens
  plus the end of sequence (9 for K=4), each one a choice. The step number, the code/label split and the line
  structure are implied by position; the runtime re-inserts them when it writes the trajectory. Codes and labels
  must each be prefix-free (no code the start of another code, no label the start of another label), so the text
  splits back into (code, label) pairs in exactly one way.
- `fused`: the compact text, written by a model whose tokenizer has each (code, label) pair as one token (added
  when fine-tuning): one forward pass per step, K tokens for K steps. The pair's token is one choice of code and
  label together; the labels' probabilities are those of the pair tokens of the code written
  (tokens.resolve_pairs, decide.ScoredMode).
- `lines`: per step one line `CODE:LABEL\\n`. The `:` and the newline are forced by the constraint yet cost a forward
  pass each (17 tokens for K=4). Kept for models fine-tuned on it.

The regex is exactly K steps, so an answer that splits into K complete steps is whole: nothing but the end of
sequence could follow it. That lets the compact format end generation on the last label (`exact_tokens`, when every
code and label is one token: tokens.LabelTokens.single_token_steps) and spare the forward pass of the forced end of
sequence: vLLM then stops at max_tokens with finish_reason `length`, and the runtime accepts that only for an answer
that splits exactly (decide.ScoredMode.parse); a cut answer never does.

A format gives the structured-outputs regex, the sentence of the system prompt that describes the answer, the
upper bound of a well-formed answer in tokens, the exact count when every name is one token (None: not known), the
text the label follows when its token id is resolved (`joiner`), and `split`, which turns the answer text into
(code, label, byte offset where the label starts) per step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .contract import scored_names_problem
from .trajectory import TrajectoryInvalid

FORMATS = ("compact", "fused", "lines")


def _wire(names: Sequence[str]) -> str:
    # Syntax every structured-outputs backend (xgrammar, guidance, outlines) reads: plain groups and `\.` as the
    # only escape (names are [A-Za-z0-9_.-]); the steps are written out K times rather than with a `{K}` quantifier.
    return "(" + "|".join(x.replace(".", "\\.") for x in names) + ")"


class LinesFormat:
    name = "lines"
    joiner = ":"

    def __init__(self, labels: Sequence[str], codes: Sequence[str], steps: int):
        self.steps = steps
        self.regex = f"{_wire(codes)}:{_wire(labels)}\\n" * steps
        alt = "(?:" + "|".join(re.escape(x) for x in codes) + ")", "(?:" + "|".join(re.escape(x) for x in labels) + ")"
        self._line = re.compile(f"({alt[0]}):({alt[1]})\n")
        self._full = re.compile(f"(?:{alt[0]}:{alt[1]}\n){{{steps}}}")
        per_step = max(len(c.encode()) for c in codes) + 1 + max(len(x.encode()) for x in labels) + 1
        self.max_tokens = steps * per_step + 1  # every token is at least one byte; +1 for the end of sequence
        self.exact_tokens: int | None = None  # the separators' tokens are the tokenizer's affair: not counted
        self.describe = (f"Answer with exactly {steps} line(s), one per reasoning step. Each line is CODE:LABEL where "
                         f"CODE is one of {', '.join(codes)} and LABEL is one of {', '.join(labels)}. The label on "
                         "the last line is the decision.")

    def split(self, content: str) -> list[tuple[str, str, int]]:
        if not self._full.fullmatch(content):
            raise TrajectoryInvalid("format", f"answer does not follow the {self.steps}-line CODE:LABEL format (was "
                                              f"the structured_outputs regex applied?); {len(content)} characters")
        out = []
        at = 0
        for m in self._line.finditer(content):
            code, label = m.group(1), m.group(2)
            out.append((code, label, at + len(code.encode()) + 1))
            at += len(m.group(0).encode())
        return out


class CompactFormat:
    name = "compact"
    joiner = ""

    def __init__(self, labels: Sequence[str], codes: Sequence[str], steps: int):
        problem = scored_names_problem(self.name, tuple(labels), tuple(codes))
        if problem:
            raise ValueError(problem)
        self.steps = steps
        self.regex = (_wire(codes) + _wire(labels)) * steps
        self._codes = tuple(codes)
        self._labels = tuple(labels)
        per_step = max(len(c.encode()) for c in codes) + max(len(x.encode()) for x in labels)
        self.max_tokens = steps * per_step + 1
        self.exact_tokens: int | None = 2 * steps  # with single-token names: one code and one label per step
        self.describe = (f"Answer with exactly {steps} reasoning step(s) and nothing else: for each step a CODE "
                         f"immediately followed by a LABEL, with no separator, space or line break, where CODE is one "
                         f"of {', '.join(codes)} and LABEL is one of {', '.join(labels)}. The label of the last step "
                         "is the decision.")

    def split(self, content: str) -> list[tuple[str, str, int]]:
        out = []
        at = 0  # character offset
        offset = 0  # byte offset (names are ASCII, but the text may not be)
        for _ in range(self.steps):
            # Prefix-free lists: at most one name starts here.
            code = next((c for c in self._codes if content.startswith(c, at)), None)
            label = next((x for x in self._labels if code and content.startswith(x, at + len(code))), None)
            if code is None or label is None:
                break
            out.append((code, label, offset + len(code)))
            at += len(code) + len(label)
            offset += len(code) + len(label)
        if len(out) != self.steps or at != len(content):
            raise TrajectoryInvalid("format", f"answer is not {self.steps} CODE+LABEL step(s) without separators (was "
                                              f"the structured_outputs regex applied?); {len(content)} characters")
        return out


class FusedFormat(CompactFormat):
    """The compact text, one token per step: the same regex, description and split; K tokens exactly."""

    name = "fused"

    def __init__(self, labels: Sequence[str], codes: Sequence[str], steps: int):
        super().__init__(labels, codes, steps)  # the pair bound too (contract.scored_names_problem)
        self.exact_tokens = steps


def scored_format(name: str, labels: Sequence[str], codes: Sequence[str],
                  steps: int) -> LinesFormat | CompactFormat:
    """The format by its decision.json name; ValueError (with what to change) when the names do not fit it."""
    if name == "compact":
        return CompactFormat(labels, codes, steps)
    if name == "fused":
        return FusedFormat(labels, codes, steps)
    if name == "lines":
        return LinesFormat(labels, codes, steps)
    raise ValueError(f"scoredFormat: {name!r} must be one of {', '.join(FORMATS)}")
