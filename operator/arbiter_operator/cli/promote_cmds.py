"""The commands that change a promotion: promote (the spec), approve, abort, retry (annotations only).

- approve: sets the `arbiter.dev/approve` annotation to `<candidate>@<time>`: a promotion with `approval: Required`
  that waits in phase Paused takes all traffic (no spec change; safe under Argo CD).
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
from datetime import UTC, datetime
from typing import Any, TextIO

from ..api.names import ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION
from ..api.promotion import IN_PROGRESS
from ..api.times import format_time
from .cluster import EXIT_GITOPS, EXIT_OK, CliError, Cluster

# Argo CD's own marks. Annotation tracking is Argo CD's default (since 3.0) and cannot be confused with anything else.
# Label tracking (argocd-cm `application.resourceTrackingMethod: label`) uses `application.instanceLabelKey`, by
# default app.kubernetes.io/instance: a label Helm charts and other operators set too, so it only counts when the user
# says label tracking is configured (--argocd-tracking-label or ARBITER_ARGOCD_TRACKING_LABEL).
ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_TRACKING_LABEL_ENV = "ARBITER_ARGOCD_TRACKING_LABEL"


def _now() -> str:
    return format_time(datetime.now(UTC))


def gitops_managed(obj: dict[str, Any], tracking_label: str | None = None) -> bool:
    """True when Argo CD tracks the object: its tracking-id annotation, or, only where Argo CD is configured for label
    tracking, its instance label (`tracking_label`, Argo CD's `application.instanceLabelKey`)."""
    meta = obj.get("metadata") or {}
    if ARGOCD_TRACKING_ANNOTATION in (meta.get("annotations") or {}):
        return True
    return bool(tracking_label) and tracking_label in (meta.get("labels") or {})


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


def cmd_promote(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    versions = [v.get("name") for v in (obj.get("spec") or {}).get("versions") or []]
    if args.version not in versions:
        raise CliError(f"version {args.version!r} is not one of spec.versions: {', '.join(map(str, versions))}")
    if args.gitops or (gitops_managed(obj, args.argocd_tracking_label) and not args.force):
        if not args.gitops:
            print(
                f"decisionmodel {args.name} is managed by Argo CD: an edit here would be reverted or show as drift.\n"
                "Commit this change instead (or use --force to edit the cluster anyway):\n",
                file=out,
            )
        print(git_change(obj, args.version, args.strategy), file=out)
        return EXIT_OK if args.gitops else EXIT_GITOPS
    patch: dict[str, Any] = {"spec": {"promote": {"version": args.version}}}
    if args.strategy:
        patch["spec"]["promote"]["strategy"] = args.strategy
    cluster.patch(args.name, patch)
    stable = ((obj.get("status") or {}).get("promotion") or {}).get("stable")
    print(f"decisionmodel.arbiter.dev/{args.name} promoting {args.version}"
          + (f" (stable: {stable})" if stable else ""), file=out)
    print(f"Follow it with: kubectl arbiter status {args.name} -n {cluster.namespace} --watch", file=out)
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


def cmd_approve(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    promo = (obj.get("status") or {}).get("promotion") or {}
    candidate = promo.get("candidate")
    if promo.get("phase") not in IN_PROGRESS or not candidate:
        raise CliError(f"nothing to approve for {args.name}: phase is {promo.get('phase', 'Idle')}, no promotion runs")
    if args.version and args.version != candidate:
        raise CliError(f"{args.name} is promoting {candidate}, not {args.version}: nothing approved")
    cluster.patch(args.name, {"metadata": {"annotations": {APPROVE_ANNOTATION: f"{candidate}@{_now()}"}}})
    if promo.get("phase") == "Paused":
        print(f"decisionmodel.arbiter.dev/{args.name}: {candidate} approved; it takes all traffic", file=out)
    else:
        print(f"decisionmodel.arbiter.dev/{args.name}: {candidate} approved in advance (phase "
              f"{promo.get('phase')}); it takes all traffic once its analyses pass", file=out)
    return 0


def cmd_retry(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    promo = (obj.get("status") or {}).get("promotion") or {}
    if promo.get("phase") != "Failed":
        raise CliError(f"nothing to retry for {args.name}: phase is {promo.get('phase', 'Idle')}, not Failed")
    cluster.patch(args.name, {"metadata": {"annotations": {RETRY_ANNOTATION: _now()}}})
    print(f"decisionmodel.arbiter.dev/{args.name}: retry of {promo.get('failedVersion')} requested", file=out)
    return 0
