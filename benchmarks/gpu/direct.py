"""Direct-to-vLLM requests built by the runtime's own code, so "direct" and "through the decision server" send the
upstream byte-for-byte the same body (same messages, constraint, logprob_token_ids, seed).

Also validates a direct answer the way the runtime does (its parser and trajectory checker): the scored-mode
validity figure measured without the decision server.
"""

from __future__ import annotations

import json
from typing import Any

import stack
import underwriting as uw


class Modes:
    """The runtime's request builders and checkers for the fixture's two decision.json files.

    Build with `await Modes.create()`: label token ids are resolved from the model directory's tokenizer.json by
    the runtime's own resolver, as the decision server does at start-up."""

    def __init__(self, cfg, tokens):
        """`tokens`: LabelTokens per scored config name ("scored": compact format, "scored-lines")."""
        from arbiter_runtime.decide import GeneratedMode, ScoredMode
        from arbiter_runtime.trajectory import TrajectoryChecker

        self.cfg = cfg
        self.tokens = tokens
        self.mode = {m: ScoredMode(c, tokens[m]) if c.trajectory_mode == "scored" else GeneratedMode(c)
                     for m, c in cfg.items()}
        self.checker = {m: TrajectoryChecker(c) for m, c in cfg.items()}

    @classmethod
    async def create(cls, model_dir: str = stack.MODEL_DIR) -> Modes:
        from arbiter_runtime.config import parse_config
        from arbiter_runtime.tokens import TokenizerJsonSource, resolve_for

        cfg = {m: parse_config(stack.fixture(f"decision-{m}.json")) for m in ("scored", "scored-lines", "generated")}
        source = TokenizerJsonSource(model_dir)
        tokens = {m: await resolve_for(source, c, source.description)
                  for m, c in cfg.items() if c.trajectory_mode == "scored"}
        return cls(cfg, tokens)

    def body(self, mode: str, applicant: dict) -> dict[str, Any]:
        from arbiter_runtime.decide import canonical_json, derive_seed

        canonical = canonical_json(applicant)
        return self.mode[mode].request(canonical, derive_seed(self.cfg[mode], canonical))

    def validate(self, mode: str, response: Any) -> tuple[bool, str | None, dict | None]:
        """(valid, reason, trajectory) for one direct vLLM answer."""
        from arbiter_runtime.trajectory import TrajectoryInvalid

        try:
            trajectory = self.mode[mode].parse(response, self.mode[mode].max_tokens)  # what body() asked for
            self.checker[mode].check(trajectory)
        except TrajectoryInvalid as exc:
            return False, f"{exc.kind}: {exc}", None
        except Exception as exc:  # a response that is not even a chat completion
            return False, f"protocol: {type(exc).__name__}: {str(exc)[:200]}", None
        return True, None, trajectory

    def decision(self, mode: str, trajectory: dict) -> str:
        return self.checker[mode].decide(trajectory)[0]


def chat_url() -> str:
    return stack.VLLM_URL + "/v1/chat/completions"


def summary_json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


__all__ = ["Modes", "chat_url", "uw"]
