"""Shell completion for `kubectl-arbiter`, driven by its argparse parser (so it cannot fall out of step with it).

Three front ends share `complete()`:
- `kubectl-arbiter completion bash|zsh` prints a script for the executable itself;
- `kubectl_complete-arbiter` is the executable kubectl (1.26+) calls to complete `kubectl arbiter ...`; it answers in
  kubectl's (cobra's) format: one candidate a line, then `:<directive>`;
- all of them call `complete()` with the words typed so far, the last one being the word to complete.
DecisionModel names come from the cluster, best effort, with a short timeout: completion never hangs or fails.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from typing import TextIO

NO_FILE_COMPLETION = 4  # cobra's ShellCompDirectiveNoFileComp

_BASH = r"""# kubectl-arbiter completion (bash). Load with: source <(kubectl-arbiter completion bash)
_kubectl_arbiter() {
    local IFS=$'\n' out
    out=$(kubectl-arbiter __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return 0
    COMPREPLY=($(printf '%s\n' "$out" | grep -v '^:'))
}
complete -F _kubectl_arbiter kubectl-arbiter
"""

_ZSH = """# kubectl-arbiter completion (zsh). Load with: source <(kubectl-arbiter completion zsh)
autoload -U +X bashcompinit && bashcompinit
""" + _BASH.split("\n", 1)[1]


def script(shell: str) -> str:
    return {"bash": _BASH, "zsh": _ZSH}[shell]


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in p._actions for opt in a.option_strings}


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _decisionmodel_names(flags: dict[str, str]) -> list[str]:
    from arbiter_operator.cli.kubectl_arbiter import CliError, Cluster

    try:
        cluster = Cluster(flags.get("kubeconfig"), flags.get("context"), flags.get("namespace"), timeout=2.0)
        return cluster.names()
    except CliError:
        return []


def candidates(p: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """What may come next; `words` are the words after the program name, the last one being completed."""
    *done, current = list(words) or [""]
    command: argparse.ArgumentParser | None = None
    positionals: list[str] = []
    seen: dict[str, str] = {}
    pending: argparse.Action | None = None
    for word in done:
        active = command or p
        if pending is not None:
            seen[pending.dest.removeprefix("g_")] = word
            pending = None
        elif word.startswith("-"):
            action = _flags(active).get(word.split("=", 1)[0])
            if action is not None and _takes_value(action) and "=" not in word:
                pending = action
        elif command is None and word in _subparsers(p):
            command = _subparsers(p)[word]
        elif command is not None:
            positionals.append(word)
    active = command or p
    if pending is not None:
        options: list[str] = list(pending.choices or [])
        if pending.dest.endswith("context"):
            options = _contexts(seen.get("kubeconfig"))
    elif current.startswith("-"):
        options = [f for f in _flags(active) if f.startswith("--") or len(f) == 2]
    elif command is None:
        options = list(_subparsers(p))
    else:
        wanted = [a for a in command._actions if not a.option_strings and a.dest != "help"]
        nxt = wanted[len(positionals)] if len(positionals) < len(wanted) else None
        if nxt is None:
            options = []
        elif nxt.choices:
            options = list(nxt.choices)
        elif nxt.dest == "name":
            options = _decisionmodel_names(seen)
        else:
            options = []
    return sorted(o for o in options if o.startswith(current))


def _contexts(kubeconfig: str | None) -> list[str]:
    from kubernetes import config

    try:
        contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception:  # a broken kubeconfig just means nothing to offer
        return []
    return [c["name"] for c in contexts or []]


def complete(p: argparse.ArgumentParser, words: Sequence[str], out: TextIO) -> int:
    for option in candidates(p, words):
        print(option, file=out)
    print(f":{NO_FILE_COMPLETION}", file=out)
    return 0


def kubectl_complete(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kubectl_complete-arbiter`: kubectl passes the words after `kubectl arbiter`."""
    from arbiter_operator.cli.kubectl_arbiter import parser

    buf = io.StringIO()
    complete(parser(), list(sys.argv[1:] if argv is None else argv), buf)
    sys.stdout.write(buf.getvalue())
    return 0
