"""`vllm serve <args>` played by the vLLM stand-in, for the plumbing runs without a GPU (ARBITER_GPU_STANDIN=1).

    python3 benchmarks/gpu/standin_vllm.py MODEL_DIR --port=8000 --served-model-name=underwriting [vLLM flags...]

Takes the operator's rendered `vllm serve` arguments as they are (the runtime's supervisor runs it in vLLM's place
through $ARBITER_VLLM_COMMAND), keeps the model directory, port and served name, ignores every other flag (dtype,
quantization, KV-cache dtype, speculative decoding: they change nothing a stand-in computes), and serves the
fixture's labels and codes as whole tokens of a tokenizer it writes into the model directory, as a model fine-tuned
with them as added tokens has them. It proves the scripts, not vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import stack  # noqa: E402
import underwriting as uw  # noqa: E402


def words(model_dir: str) -> tuple[str, ...]:
    """The whole tokens of the model served from `model_dir`: every (code, label) pair for the fused format's model
    (stack.FUSED_MODEL_DIR), else each label and code."""
    return uw.PAIRS if model_dir.rstrip("/") == stack.FUSED_MODEL_DIR else (*uw.LABELS, *uw.CODES)


def standin_argv(vllm_args: list[str]) -> tuple[list[str], str]:
    """The stand-in's command-line arguments for these `vllm serve` arguments, and the model directory."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=uw.MODEL_NAME)
    known, _ = ap.parse_known_args(vllm_args)
    return ["--host", known.host, "--port", str(known.port), "--served-model-name", known.served_model_name,
            "--words", ",".join(words(known.model)), "--added-tokens"], known.model


def write_model(model_dir: str, served_name: str) -> None:
    """The stand-in's tokenizer.json and config.json in the model directory, each file replaced whole (several
    replicas may share the directory, and their decision servers read it)."""
    from arbiter_devenv.vllm_standin import write_model_dir

    whole = words(model_dir)
    Path(model_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_dir) as tmp:
        write_model_dir(tmp, whole, served_name, added=True)
        for name in ("tokenizer.json", "config.json"):
            os.replace(Path(tmp) / name, Path(model_dir) / name)


def main(argv: list[str] | None = None) -> None:
    from arbiter_devenv.vllm_standin import main as standin

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "serve":  # called the way `vllm serve` is
        args = args[1:]
    argv_, model_dir = standin_argv(args)
    write_model(model_dir, argv_[argv_.index("--served-model-name") + 1])
    standin(argv_)


if __name__ == "__main__":
    main()
