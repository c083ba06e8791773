"""`kubectl arbiter COMMAND`: the promotion surface for SREs, and the way to see and ask a DecisionModel.

Installed as the `kubectl-arbiter` executable, which kubectl finds on PATH as a plugin. Works against any cluster the
kubeconfig reaches, with kubectl's flags (--kubeconfig, --context, -n/--namespace, --as, --as-group,
--request-timeout). Errors are one line on stderr with a documented exit code (cluster.EXIT_*), never a traceback.

This module is the command line only (flags, dispatch, errors); each family of commands has its module:
- status_cmds: status (once, --watch, --timeout), history, list: read only;
- promote_cmds: promote (edits the spec), approve, abort, retry (annotations; spec untouched);
- lint: offline checks of manifests, the apiserver's and the operator's rules (no cluster);
- diagnose: a ranked verdict on why a model does not decide well, from the cluster and its metrics (read only);
- dashboard: a local read-only web page of every model and its promotions;
- completion: shell completion.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from .cluster import (
    EXIT_API,
    EXIT_CONFIG,
    EXIT_DEGRADED,
    EXIT_FORBIDDEN,
    EXIT_GITOPS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    Cluster,
    parse_timeout,
)
from .promote_cmds import (
    ARGOCD_TRACKING_LABEL_ENV,
    cmd_abort,
    cmd_approve,
    cmd_promote,
    cmd_retry,
    git_change,
    gitops_managed,
)
from .status_cmds import cmd_history, cmd_list, cmd_status

__all__ = [
    "EXIT_API",
    "EXIT_CONFIG",
    "EXIT_DEGRADED",
    "EXIT_FORBIDDEN",
    "EXIT_GITOPS",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CliError",
    "Cluster",
    "git_change",
    "gitops_managed",
    "main",
    "parse_timeout",
    "parser",
    "plugin_version",
]

DISTRIBUTION = "arbiter-operator"


def plugin_version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def cmd_diagnose(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    from .diagnose.command import run

    return int(run(cluster, args, out))


def cmd_dashboard(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    from .dashboard.server import run

    return int(run(cluster, args, out))


GLOBAL_FLAGS = ("kubeconfig", "context", "namespace", "as_user", "as_group", "request_timeout")


def _kubectl_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument("--kubeconfig", dest=f"{prefix}kubeconfig", default=None, metavar="FILE",
                   help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", dest=f"{prefix}context", default=None, help="kubeconfig context to use")
    p.add_argument("-n", "--namespace", dest=f"{prefix}namespace", default=None,
                   help="namespace (default: the context's, then default)")
    p.add_argument("--as", dest=f"{prefix}as_user", default=None, metavar="USER", help="impersonate this user")
    p.add_argument("--as-group", dest=f"{prefix}as_group", action="append", default=None, metavar="GROUP",
                   help="impersonate this group (repeatable; needs --as)")
    p.add_argument("--request-timeout", dest=f"{prefix}request_timeout", type=parse_timeout, default=None,
                   metavar="DURATION", help="give up on a request after this long (30, 10s, 1m; 0 = no limit)")


def _duration(text: str) -> float:
    seconds = parse_timeout(text)
    if seconds is None:
        raise argparse.ArgumentTypeError("a duration above 0 (e.g. 90s, 5m)")
    return seconds


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")


def parser() -> argparse.ArgumentParser:
    # kubectl hands plugins their arguments as typed, so `-n NS` may come before or after the command: the flags
    # exist at both levels (under different dests) and are merged in main().
    p = argparse.ArgumentParser(
        prog="kubectl arbiter", description="Promote, watch, diagnose and lint Arbiter DecisionModels.",
        epilog="Exit codes: 0 done, 1 refused by the resource's state, 2 bad command line, 3 managed by Argo CD "
               "(change for Git printed), 4 no usable kubeconfig, 5 apiserver unreachable, 6 unauthorized or "
               "forbidden, 7 not found, 8 other apiserver error, 9 promotion failed or rolled back (status "
               "--timeout), 10 timed out (status --timeout), 11 problems found (lint, diagnose).")
    p.add_argument("--version", action="version", version=f"kubectl-arbiter {plugin_version()}")
    _kubectl_flags(p, prefix="g_")
    common = argparse.ArgumentParser(add_help=False)
    _kubectl_flags(common)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, cluster: bool = True) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common] if cluster else [], help=help, description=help)

    _promotion_commands(add)
    _asking_commands(add)
    s = add("completion", "print a shell completion script: source <(kubectl-arbiter completion bash)", cluster=False)
    s.add_argument("shell", choices=["bash", "zsh"])
    return p


def _promotion_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """status, list, promote, approve, abort, retry, history."""
    s = add("status", "phase, traffic, last analysis and conditions; --watch to follow, --timeout to wait")
    s.add_argument("name")
    _output(s)
    s.add_argument("-w", "--watch", action="store_true", help="redraw whenever the DecisionModel changes")
    s.add_argument("--timeout", type=_duration, default=None, metavar="DURATION",
                   help="wait until the promotion the spec asks for is done (exit 0), fails or is rolled back "
                        "(exit 9), or DURATION passes (exit 10)")
    s = add("list", "every DecisionModel of the namespace: phase, active, candidate, weight, Ready")
    s.add_argument("-A", "--all-namespaces", action="store_true", help="DecisionModels of every namespace")
    _output(s)
    s = add("promote", "set spec.promote.version (not for GitOps-managed resources)")
    s.add_argument("name")
    s.add_argument("version")
    s.add_argument("--strategy", choices=["Immediate", "Canary", "Shadow"], default=None)
    s.add_argument("--gitops", action="store_true", help="print the change to commit to Git; change nothing")
    s.add_argument("--force", action="store_true", help="edit the spec even when Argo CD manages the resource")
    s.add_argument("--argocd-tracking-label", metavar="KEY", default=os.environ.get(ARGOCD_TRACKING_LABEL_ENV),
                   help="Argo CD uses label tracking with this label key (its application.instanceLabelKey, e.g. "
                        f"app.kubernetes.io/instance); default ${ARGOCD_TRACKING_LABEL_ENV}, else annotation only")
    s = add("approve", "let a promotion waiting for approval take all traffic (annotation; spec untouched)")
    s.add_argument("name")
    s.add_argument("version", nargs="?", default=None, help="refuse unless this is the candidate being promoted")
    s = add("abort", "roll the running promotion back now (annotation; spec untouched)")
    s.add_argument("name")
    s = add("retry", "retry a failed promotion (annotation; spec untouched)")
    s.add_argument("name")
    s = add("history", "the last promotions with outcome and duration")
    s.add_argument("name")
    _output(s)


def _asking_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """diagnose, dashboard, lint."""
    s = add("diagnose", "why a model is not Ready or decides badly: a ranked verdict with evidence and the fix")
    s.add_argument("name")
    _output(s)
    _metrics_flags(s)
    s.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                   help="a decision server's address (e.g. after `kubectl port-forward`), read at URL/metrics and "
                        "URL/metrics/vllm; repeatable, one per version")
    s = add("dashboard", "serve a local read-only web page of every model and its promotions")
    s.add_argument("-A", "--all-namespaces", action="store_true", help="models of every namespace")
    s.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    s.add_argument("--port", type=int, default=8421, help="port to listen on (default 8421; 0: any free port)")
    _metrics_flags(s)
    s = add("lint", "check DecisionModel manifests offline with the apiserver's and the operator's rules",
            cluster=False)
    s.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON manifests ('-' reads stdin)")
    s.add_argument("--model-config", metavar="FILE", default=None,
                   help="the model's config.json: also check tensor parallel (spec.serving.gpus), pipeline stages "
                        "and maxModelLen against it")
    s.add_argument("--namespace", "-n", dest="lint_namespace", default=None,
                   help="namespace the manifests are for, when they do not say (host name limits depend on it)")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")


def _metrics_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--prometheus", default=os.environ.get("ARBITER_PROMETHEUS_URL"), metavar="URL",
                   help="Prometheus (or Thanos querier) to read the models' metrics from, with the kubeconfig's "
                        "bearer token; default $ARBITER_PROMETHEUS_URL")
    s.add_argument("--window", type=_duration, default=600.0, metavar="DURATION",
                   help="how far back rates and quantiles look in Prometheus (default 10m)")
    s.add_argument("--metrics-token", default=os.environ.get("ARBITER_METRICS_TOKEN"), metavar="TOKEN",
                   help="bearer token for Prometheus and the decision servers' metrics (default "
                        "$ARBITER_METRICS_TOKEN, else the kubeconfig's token)")


COMMANDS: dict[str, Callable[[Cluster, argparse.Namespace, TextIO], int]] = {
    "status": cmd_status, "list": cmd_list, "promote": cmd_promote, "approve": cmd_approve, "abort": cmd_abort,
    "retry": cmd_retry, "history": cmd_history, "diagnose": cmd_diagnose, "dashboard": cmd_dashboard}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["__complete"]:
        from arbiter_operator.cli import completion

        return completion.complete(parser(), argv[1:], out)
    args = parser().parse_args(argv)
    if args.command == "completion":
        from arbiter_operator.cli import completion

        print(completion.script(args.shell), file=out)
        return EXIT_OK
    for flag in GLOBAL_FLAGS:
        setattr(args, flag, getattr(args, flag, None) or getattr(args, f"g_{flag}"))
    try:
        if args.command == "lint":
            from arbiter_operator.cli import lint

            return lint.run(args, out)
        cluster = Cluster(args.kubeconfig, args.context, args.namespace, args.as_user, args.as_group or (),
                          args.request_timeout)
        return COMMANDS[args.command](cluster, args, out)
    except CliError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever a library put in it
        return exc.code
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A DecisionModel whose status does not have the shape the operator writes (edited by hand, another
        # version of the operator): say so in one line rather than with a traceback.
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"error: unexpected content in the DecisionModel's status ({detail})", file=sys.stderr)
        return EXIT_API


if __name__ == "__main__":
    sys.exit(main())
