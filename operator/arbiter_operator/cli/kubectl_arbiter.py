"""`kubectl arbiter status|promote|approve|abort|retry|history NAME`: the promotion surface for SREs.

Installed as the `kubectl-arbiter` executable, which kubectl finds on PATH as a plugin. Works against any cluster the
kubeconfig reaches, with kubectl's flags (--kubeconfig, --context, -n/--namespace, --as, --as-group,
--request-timeout). Errors are one line on stderr with a documented exit code (see EXIT_*), never a traceback.

Which commands write what:
- status, history: read only.
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
import contextlib
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO, cast

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3._collections import HTTPHeaderDict

from ..api.names import (
    ABORT_ANNOTATION,
    APPROVE_ANNOTATION,
    CLI_FIELD_MANAGER,
    GROUP,
    PLURAL,
    RETRY_ANNOTATION,
    VERSION,
)
from ..api.promotion import IN_PROGRESS
from ..api.times import format_time
from .printing import print_history, print_status

DISTRIBUTION = "arbiter-operator"
FIELD_MANAGER = CLI_FIELD_MANAGER
# Argo CD's own marks. Annotation tracking is Argo CD's default (since 3.0) and cannot be confused with anything else.
# Label tracking (argocd-cm `application.resourceTrackingMethod: label`) uses `application.instanceLabelKey`, by
# default app.kubernetes.io/instance: a label Helm charts and other operators set too, so it only counts when the user
# says label tracking is configured (--argocd-tracking-label or ARBITER_ARGOCD_TRACKING_LABEL).
ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_TRACKING_LABEL_ENV = "ARBITER_ARGOCD_TRACKING_LABEL"

# Exit codes (documented in docs/operations.md): scripts tell "fix your kubeconfig" from "the cluster said no".
EXIT_OK = 0
EXIT_REFUSED = 1  # the resource's state does not allow the command (nothing to retry, unknown version, ...)
EXIT_USAGE = 2  # argparse's own code for a malformed command line
EXIT_GITOPS = 3  # managed by Argo CD: nothing changed, the change for Git was printed
EXIT_CONFIG = 4  # no usable kubeconfig or context
EXIT_UNREACHABLE = 5  # the apiserver could not be reached or did not answer in time
EXIT_FORBIDDEN = 6  # 401/403: not authenticated or not allowed
EXIT_NOT_FOUND = 7  # the DecisionModel (or the DecisionModel API itself) does not exist
EXIT_API = 8  # any other apiserver error (conflict, invalid, 5xx)


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def plugin_version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def _now() -> str:
    return format_time(datetime.now(UTC))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_timeout(text: str) -> float | None:
    """kubectl's --request-timeout: a bare number of seconds or a Go duration ("500ms", "1m30s"); 0 means none."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif text and _DURATION.sub("", text) == "":
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        seconds = sum(float(n) * scale[u] for n, u in _DURATION.findall(text))
    else:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 30, 10s, 1m, 500ms; 0 = no limit)")
    return seconds or None


class _Impersonating:
    """Adds Impersonate-User and one Impersonate-Group header per group (kubectl's --as/--as-group) to every request.

    The generated client keeps headers in a plain dict, which cannot repeat a name; urllib3's HTTPHeaderDict can.
    """

    def __init__(self, pool: Any, user: str | None, groups: Sequence[str]) -> None:
        self._pool, self._user, self._groups = pool, user, list(groups)

    def request(self, method: str, url: str, headers: Any = None, **kw: Any) -> Any:
        merged = HTTPHeaderDict(headers or {})
        if self._user:
            merged["Impersonate-User"] = self._user
        for group in self._groups:
            merged.add("Impersonate-Group", group)
        return self._pool.request(method, url, headers=merged, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _api_error(exc: ApiException, what: str) -> CliError:
    detail = exc.reason
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        detail = json.loads(exc.body or "").get("message", detail)
    if exc.status in (401, 403):
        hint = " (log in again)" if exc.status == 401 else " (ask for a Role that allows it, or use --as)"
        return CliError(f"{what}: {detail}{hint}", EXIT_FORBIDDEN)
    if exc.status == 404:
        return CliError(f"{what}: {detail}", EXIT_NOT_FOUND)
    return CliError(f"{what}: {exc.status} {detail}", EXIT_API)


def _checked(obj: Any, what: str) -> dict[str, Any]:
    """The shape every command relies on; anything else is the apiserver (or a proxy) answering nonsense."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not (isinstance(meta, dict) and isinstance(meta.get("name"), str) and isinstance(meta.get("namespace"), str)
            and isinstance(obj.get("spec") or {}, dict) and isinstance(obj.get("status") or {}, dict)):
        raise CliError(f"unexpected answer for {what}: not a DecisionModel object", EXIT_API)
    return cast("dict[str, Any]", obj)


def _checked_list(items: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        raise CliError(f"unexpected answer for {what}: no item list", EXIT_API)
    return [_checked(item, what) for item in items]


class Cluster:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None,
                 user: str | None = None, groups: Sequence[str] = (), timeout: float | None = None) -> None:
        configuration = client.Configuration()
        ctx_ns = None
        # kubectl's order: --kubeconfig, then $KUBECONFIG (a ':'-separated list; empty counts as unset), then ~/.kube.
        files = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        exists = any(os.path.exists(os.path.expanduser(f)) for f in files.split(os.pathsep) if f)
        try:
            if exists or kubeconfig:
                config.load_kube_config(config_file=files, context=context, client_configuration=configuration,
                                        persist_config=False)
                contexts, active = config.list_kube_config_contexts(config_file=files)
                if context:
                    active = next((c for c in contexts if c.get("name") == context), active)
                ctx_ns = (active or {}).get("context", {}).get("namespace")
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=configuration)
            else:
                raise CliError(f"no kubeconfig: {files} does not exist; log in (oc login, or kubectl config) or "
                               "pass --kubeconfig FILE", EXIT_CONFIG)
        except (config.ConfigException, OSError, yaml.YAMLError, TypeError, ValueError, KeyError,
                AttributeError) as exc:
            raise CliError(f"cannot use kubeconfig {files}: {exc}", EXIT_CONFIG) from None
        # One attempt per request, like kubectl: an unreachable server answers within --request-timeout, not 4x.
        configuration.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=3, status=0, other=0)
        self.server = configuration.host
        self.namespace = namespace or ctx_ns or "default"
        self.timeout = timeout
        api_client = client.ApiClient(configuration)
        if user or groups:
            if groups and not user:
                raise CliError("--as-group needs --as (the apiserver impersonates groups only with a user)",
                               EXIT_CONFIG)
            api_client.rest_client.pool_manager = _Impersonating(  # type: ignore[assignment]  # (a wrapper)
                api_client.rest_client.pool_manager, user, groups)
        self.api = client.CustomObjectsApi(api_client)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self.timeout:
            kw["_request_timeout"] = self.timeout
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            raise _api_error(exc, what) from None
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            timed_out = (isinstance(exc, urllib3.exceptions.TimeoutError) or isinstance(
                reason, (TimeoutError, urllib3.exceptions.TimeoutError, socket.timeout)))
            if isinstance(reason, urllib3.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(reason):
                msg = f"TLS to {self.server} failed: {reason}"
            elif isinstance(reason, urllib3.exceptions.NewConnectionError):  # a subclass of the timeout error
                msg = f"cannot reach the apiserver {self.server}: {reason}"
            elif timed_out:
                limit = f"within --request-timeout={self.timeout:g}s" if self.timeout else "in time"
                msg = f"the apiserver {self.server} did not answer {limit}"
            else:
                msg = f"cannot reach the apiserver {self.server}: {reason}"
            raise CliError(msg, EXIT_UNREACHABLE) from None

    def get(self, name: str) -> dict[str, Any]:
        try:
            obj = self._call(f"cannot read decisionmodel {self.namespace}/{name}",
                             self.api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name)
        except CliError as exc:
            if exc.code == EXIT_NOT_FOUND:
                raise CliError(f'decisionmodel "{name}" not found in namespace "{self.namespace}" (is Arbiter '
                               "installed on this cluster? `kubectl get crd decisionmodels.arbiter.dev`)",
                               EXIT_NOT_FOUND) from None
            raise
        return _checked(obj, f"decisionmodel {self.namespace}/{name}")

    def names(self) -> list[str]:
        found = self._call("cannot list decisionmodels", self.api.list_namespaced_custom_object, GROUP, VERSION,
                           self.namespace, PLURAL)
        items = found.get("items") if isinstance(found, dict) else None
        return [str(item["metadata"]["name"]) for item in _checked_list(items, "decisionmodels")]

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _checked(self._call(f"cannot update decisionmodel {self.namespace}/{name}",
                          self.api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name, body,
                          field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json"), "the patch")

# -- rendering ------------------------------------------------------------------------------------------------------


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


# -- commands -------------------------------------------------------------------------------------------------------


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


def parser() -> argparse.ArgumentParser:
    # kubectl hands plugins their arguments as typed, so `-n NS` may come before or after the command: the flags
    # exist at both levels (under different dests) and are merged in main().
    p = argparse.ArgumentParser(
        prog="kubectl arbiter", description="Promote, abort and inspect Arbiter DecisionModel versions.",
        epilog="Exit codes: 0 done, 1 refused by the resource's state, 2 bad command line, 3 managed by Argo CD "
               "(change for Git printed), 4 no usable kubeconfig, 5 apiserver unreachable, 6 unauthorized or "
               "forbidden, 7 not found, 8 other apiserver error.")
    p.add_argument("--version", action="version", version=f"kubectl-arbiter {plugin_version()}")
    _kubectl_flags(p, prefix="g_")
    common = argparse.ArgumentParser(add_help=False)
    _kubectl_flags(common)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, cluster: bool = True) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common] if cluster else [], help=help, description=help)

    s = add("status", "phase, traffic, last analysis and conditions")
    s.add_argument("name")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
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
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    s = add("completion", "print a shell completion script: source <(kubectl-arbiter completion bash)", cluster=False)
    s.add_argument("shell", choices=["bash", "zsh"])
    return p


COMMANDS = {"status": cmd_status, "promote": cmd_promote, "approve": cmd_approve, "abort": cmd_abort,
            "retry": cmd_retry,
            "history": cmd_history}


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
        setattr(args, flag, getattr(args, flag) or getattr(args, f"g_{flag}"))
    try:
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
