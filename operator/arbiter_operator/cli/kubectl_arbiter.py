"""`kubectl arbiter status|promote|abort|retry|history NAME`: the promotion surface for SREs.

Installed as the `kubectl-arbiter` executable, which kubectl finds on PATH as a plugin. Works against any cluster the
kubeconfig reaches (--kubeconfig, --context, -n like kubectl).

Which commands write what:
- status, history: read only.
- retry: sets the `arbiter.dev/retry` annotation to a new value (no spec change; safe under Argo CD).
- abort: sets the `arbiter.dev/abort` annotation to a new value: the running promotion rolls back at once, the spec
  is untouched (safe under Argo CD; the spec still names the candidate, so the resource stays Degraded until Git is
  changed back or a retry is asked for).
- promote: edits `spec.promote.version`. For clusters not managed by GitOps. When the DecisionModel is managed by
  Argo CD it refuses (Argo CD would revert the edit, or report drift) and prints the change to make in Git instead;
  `--gitops` prints that change without touching the cluster, `--force` edits anyway.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any, Sequence, TextIO

from kubernetes import client, config
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "arbiter.dev", "v1alpha1", "decisionmodels"
RETRY_ANNOTATION = "arbiter.dev/retry"
ABORT_ANNOTATION = "arbiter.dev/abort"
FIELD_MANAGER = "kubectl-arbiter"
# How Argo CD marks what it manages: annotation tracking (default since Argo CD 3) or label tracking.
ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_TRACKING_LABEL = "app.kubernetes.io/instance"
IN_PROGRESS = ("Deploying", "Waiting", "Progressing")


class CliError(Exception):
    pass


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class Cluster:
    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            ctx_ns = (active or {}).get("context", {}).get("namespace")
        except config.ConfigException:
            config.load_incluster_config()
            ctx_ns = None
        self.namespace = namespace or ctx_ns or "default"
        self.api = client.CustomObjectsApi()

    def get(self, name: str) -> dict[str, Any]:
        try:
            return self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                raise CliError(f'decisionmodel "{name}" not found in namespace "{self.namespace}"') from None
            raise CliError(f"cannot read decisionmodel {self.namespace}/{name}: {exc.status} {exc.reason}") from None

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                body,
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            detail = exc.reason
            try:
                detail = json.loads(exc.body).get("message", detail)
            except (TypeError, ValueError):
                pass
            raise CliError(f"cannot update decisionmodel {self.namespace}/{name}: {detail}") from None


# -- rendering ------------------------------------------------------------------------------------------------------


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _traffic(obj: dict[str, Any]) -> str:
    serving = _cond(obj, "Serving")
    if serving and serving.get("status") == "True":
        return serving.get("message", "").removeprefix("Serving ")
    promo = (obj.get("status") or {}).get("promotion") or {}
    if not promo.get("stable"):
        return "none"
    w = promo.get("weight", 0)
    if promo.get("phase") == "Progressing" and 0 < w < 100:
        return f"{promo['stable']} {100 - w}%, {promo.get('candidate')} {w}%"
    return f"{promo['stable']} 100%"


def print_status(obj: dict[str, Any], out: TextIO) -> None:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    promo = status.get("promotion") or {}
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    print(f"Name:        {meta['namespace']}/{meta['name']}", file=out)
    print(f"Wanted:      {(spec.get('promote') or {}).get('version')} "
          f"({(spec.get('promote') or {}).get('strategy', 'Immediate')})", file=out)
    print(f"Phase:       {promo.get('phase', 'Idle')}", file=out)
    print(f"Stable:      {promo.get('stable') or '-'}", file=out)
    if promo.get("candidate"):
        line = promo["candidate"]
        if promo.get("phase") == "Progressing":
            n = len((spec.get("promote") or {}).get("steps") or [])
            line += f" (step {promo.get('step', 0) + 1}/{n}, {promo.get('weight', 0)}%)"
        print(f"Candidate:   {line}", file=out)
    if promo.get("previous"):
        print(f"Previous:    {promo['previous']} (warm until {promo.get('coolingUntil')})", file=out)
    print(f"Traffic:     {_traffic(obj)}", file=out)
    if gen is not None and observed is not None and observed < gen:
        print(f"Note:        the operator has not processed generation {gen} yet (status is for {observed})", file=out)
    last = promo.get("lastAnalysis")
    if last:
        print(f"Analysis:    {last.get('verdict')} at {last.get('at')}: {last.get('message', '')}", file=out)
    if promo.get("failureReason"):
        print(f"Failure:     {promo['failureReason']}: {promo.get('failureMessage', '')}", file=out)
    print("Conditions:", file=out)
    for c in status.get("conditions") or []:
        print(f"  {c['type']:<15} {c['status']:<8} {c.get('reason', ''):<26} {c.get('message', '')}", file=out)
    if promo.get("phase") == "Failed":
        print(f"\nTo try again: kubectl arbiter retry {meta['name']} -n {meta['namespace']}  (or change the spec)",
              file=out)


def print_history(obj: dict[str, Any], out: TextIO) -> None:
    history = ((obj.get("status") or {}).get("promotion") or {}).get("history") or []
    if not history:
        print("No promotions recorded.", file=out)
        return
    print(f"{'FINISHED':<22}{'VERSION':<14}{'FROM':<14}{'OUTCOME':<12}{'DURATION':>10}  REASON", file=out)
    for rec in reversed(history):
        print(
            f"{rec.get('finishedAt', ''):<22}{rec.get('version', ''):<14}{rec.get('fromVersion') or '-':<14}"
            f"{rec.get('outcome', ''):<12}{rec.get('durationSeconds', 0):>9.0f}s  {rec.get('reason', '')}",
            file=out,
        )


def gitops_managed(obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    return ARGOCD_TRACKING_ANNOTATION in (meta.get("annotations") or {}) or ARGOCD_TRACKING_LABEL in (
        meta.get("labels") or {}
    )


def git_change(obj: dict[str, Any], version: str, strategy: str | None) -> str:
    meta = obj["metadata"]
    promote = dict((obj.get("spec") or {}).get("promote") or {})
    old = promote.get("version")
    lines = [
        f"# In the Git manifest of DecisionModel {meta['namespace']}/{meta['name']}:",
        "spec:",
        "  promote:",
        f'-   version: "{old}"',
        f'+   version: "{version}"',
    ]
    if strategy and strategy != promote.get("strategy"):
        lines += [f"-   strategy: {promote.get('strategy', 'Immediate')}", f"+   strategy: {strategy}"]
    return "\n".join(lines)


# -- commands -------------------------------------------------------------------------------------------------------


def cmd_promote(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    versions = [v.get("name") for v in (obj.get("spec") or {}).get("versions") or []]
    if args.version not in versions:
        raise CliError(f"version {args.version!r} is not one of spec.versions: {', '.join(map(str, versions))}")
    if args.gitops or (gitops_managed(obj) and not args.force):
        if not args.gitops:
            print(
                f"decisionmodel {args.name} is managed by Argo CD: an edit here would be reverted or show as drift.\n"
                "Commit this change instead (or use --force to edit the cluster anyway):\n",
                file=out,
            )
        print(git_change(obj, args.version, args.strategy), file=out)
        return 0 if args.gitops else 3
    patch: dict[str, Any] = {"spec": {"promote": {"version": args.version}}}
    if args.strategy:
        patch["spec"]["promote"]["strategy"] = args.strategy
    cluster.patch(args.name, patch)
    stable = ((obj.get("status") or {}).get("promotion") or {}).get("stable")
    print(f"decisionmodel.arbiter.dev/{args.name} promoting {args.version}"
          + (f" (stable: {stable})" if stable else ""), file=out)
    print(f"Follow it with: kubectl arbiter status {args.name} -n {cluster.namespace}", file=out)
    return 0


def cmd_abort(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    promo = (obj.get("status") or {}).get("promotion") or {}
    if promo.get("phase") not in IN_PROGRESS:
        raise CliError(f"no promotion in progress for {args.name} (phase {promo.get('phase', 'Idle')})")
    cluster.patch(args.name, {"metadata": {"annotations": {ABORT_ANNOTATION: _now()}}})
    stable = promo.get("stable")
    print(f"decisionmodel.arbiter.dev/{args.name}: abort requested; promotion of {promo.get('candidate')} rolls back"
          + (f" to {stable}" if stable else ""), file=out)
    if stable:
        print(f"spec.promote still names {promo.get('candidate')}: change it to {stable!r} in Git (or retry later) "
              "to clear the Degraded state.", file=out)
    return 0


def cmd_retry(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    promo = (obj.get("status") or {}).get("promotion") or {}
    if promo.get("phase") != "Failed":
        raise CliError(f"nothing to retry for {args.name}: phase is {promo.get('phase', 'Idle')}, not Failed")
    cluster.patch(args.name, {"metadata": {"annotations": {RETRY_ANNOTATION: _now()}}})
    print(f"decisionmodel.arbiter.dev/{args.name}: retry of {promo.get('failedVersion')} requested", file=out)
    return 0


def cmd_status(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    if args.output == "json":
        print(json.dumps(obj.get("status") or {}, indent=2), file=out)
    else:
        print_status(obj, out)
    return 0


def cmd_history(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    if args.output == "json":
        print(json.dumps(((obj.get("status") or {}).get("promotion") or {}).get("history") or [], indent=2), file=out)
    else:
        print_history(obj, out)
    return 0


def parser() -> argparse.ArgumentParser:
    # kubectl hands plugins their arguments as typed, so `-n NS` may come before or after the command: the flags
    # exist at both levels (under different dests) and are merged in main().
    p = argparse.ArgumentParser(prog="kubectl arbiter", description="Promote, abort and inspect Arbiter versions.")
    p.add_argument("--kubeconfig", dest="g_kubeconfig", default=None)
    p.add_argument("--context", dest="g_context", default=None)
    p.add_argument("-n", "--namespace", dest="g_namespace", default=None)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", default=None)
    common.add_argument("--context", default=None)
    common.add_argument("-n", "--namespace", default=None)
    sub = p.add_subparsers(dest="command", required=True)
    _add = sub.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return _add(name, parents=[common], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]
    s = sub.add_parser("status", help="phase, traffic, last analysis and conditions")
    s.add_argument("name")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    s = sub.add_parser("promote", help="set spec.promote.version (not for GitOps-managed resources)")
    s.add_argument("name")
    s.add_argument("version")
    s.add_argument("--strategy", choices=["Immediate", "Canary"], default=None)
    s.add_argument("--gitops", action="store_true", help="print the change to commit to Git; change nothing")
    s.add_argument("--force", action="store_true", help="edit the spec even when Argo CD manages the resource")
    s = sub.add_parser("abort", help="roll the running promotion back now (annotation; spec untouched)")
    s.add_argument("name")
    s = sub.add_parser("retry", help="retry a failed promotion (annotation; spec untouched)")
    s.add_argument("name")
    s = sub.add_parser("history", help="the last promotions with outcome and duration")
    s.add_argument("name")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    return p


COMMANDS = {"status": cmd_status, "promote": cmd_promote, "abort": cmd_abort, "retry": cmd_retry,
            "history": cmd_history}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = parser().parse_args(argv)
    for flag in ("kubeconfig", "context", "namespace"):
        setattr(args, flag, getattr(args, flag) or getattr(args, f"g_{flag}"))
    try:
        cluster = Cluster(args.kubeconfig, args.context, args.namespace)
        return COMMANDS[args.command](cluster, args, out)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
