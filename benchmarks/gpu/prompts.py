"""The chat messages the decision server sends upstream for one applicant, per trajectory mode.

The model is trained on exactly these messages. The system message per mode is the runtime's own, rendered by
`render_fixture.py` (with arbiter_runtime's code) into fixture/prompts.json; the user message is the input document
as the runtime writes it (canonical JSON: sorted keys, compact). gpu_check.py re-renders on the GPU machine and
fails on drift, so a changed runtime prompt cannot silently meet a model trained on the old one.
"""

from __future__ import annotations

import json
from pathlib import Path

import underwriting as uw

FIXTURE = Path(__file__).resolve().parent / "fixture" / "prompts.json"
_SYSTEM = {mode: v["system"] for mode, v in json.loads(FIXTURE.read_text()).items()}
SOURCE = "arbiter_runtime.decide (ScoredMode/GeneratedMode), rendered into benchmarks/gpu/fixture/prompts.json"


def messages(applicant: dict, mode: str) -> list[dict]:
    return [{"role": "system", "content": _SYSTEM[mode]}, {"role": "user", "content": uw.applicant_text(applicant)}]


def messages_text(applicant: dict, mode: str) -> str:
    """The messages' contents joined, for training the tokenizer."""
    return "\n".join(m["content"] for m in messages(applicant, mode))
