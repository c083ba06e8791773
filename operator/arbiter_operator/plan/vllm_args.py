"""`spec.serving.vllm.extraArgs` read the way `vllm serve` reads them, so a flag cannot slip past the checks by
spelling: vLLM's FlexibleArgumentParser turns `_` into `-` in a `--` flag's name (up to the first `.`), takes
`--flag=value` and `--flag value` alike, knows short aliases (`-tp`, `-pp`, ...), and argparse accepts an
unambiguous prefix of a long flag (`--tensor-parallel` is `--tensor-parallel-size`). `--config FILE` would load flags
from a file nobody can see here, so it is refused too.

The CRD refuses the exact, `_` and alias spellings at admission (CEL); this module is the operator's full check,
reported as InvalidSpec. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..api.vllm_flags import MANAGED_VLLM_FLAGS, REMOVED_VLLM_FLAGS, UNSAFE_VLLM_FLAGS, VLLM_SHORT_ALIASES

# Flags a config file could set unseen: refused outright.
OPAQUE_FLAGS = {"--config": "--config loads flags from a file the operator cannot check; put the flags in extraArgs"}


def flag_name(arg: str) -> str | None:
    """The long flag an argument names, as vLLM's parser sees it (None: a value or positional argument)."""
    if arg.startswith("--") and len(arg) > 2:
        key = arg.split("=", 1)[0]
        head, _dot, _tail = key[2:].partition(".")
        return "--" + head.replace("_", "-")  # `--structured-outputs-config.backend` names the config flag itself
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        key = arg.split("=", 1)[0]
        if key.startswith("-O"):
            return VLLM_SHORT_ALIASES["-O"]  # -O3, -O=3, -O 3 (vLLM's own special case)
        return VLLM_SHORT_ALIASES.get(key)
    return None


def _checked() -> dict[str, str]:
    out = dict(OPAQUE_FLAGS)
    out.update(REMOVED_VLLM_FLAGS)
    out.update(UNSAFE_VLLM_FLAGS)
    out.update({f: f"{f} is set by the operator from {field}; set that field instead of extraArgs"
                for f, field in MANAGED_VLLM_FLAGS.items()})
    return out


CHECKED = _checked()


def arg_problems(args: Iterable[str]) -> list[str]:
    """One message per offending argument, naming it as written and what vLLM would read it as."""
    problems: list[str] = []
    for arg in args:
        name = flag_name(arg)
        if name is None:
            continue
        # argparse's prefix matching: `--max-model` is `--max-model-len` when nothing else starts so
        hits = [name] if name in CHECKED else [f for f in CHECKED if f.startswith(name) and len(name) > 3]
        for flag in hits:
            said = "" if arg.split("=", 1)[0] == flag else f" (vLLM reads {arg.split('=', 1)[0]!r} as {flag})"
            problems.append(f"spec.serving.vllm.extraArgs {arg!r}{said}: {CHECKED[flag]}")
    return list(dict.fromkeys(problems))
