"""`python -m arbiter_operator`: run the operator (kopf standalone: no peering objects; with --leader-elect, one of
several replicas, of which only the holder of the leader Lease reconciles and writes)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .api.serving import DEFAULT_METRICS_READER_SECRET
from .settings import ARGOCD_NAMESPACE_ENV, METRICS_READER_SECRET_ENV, S3_OWN_CREDENTIALS_ENV

if TYPE_CHECKING:
    from .admission import WebhookConfig
    from .app import OperatorConfig
    from .metrics_server import MetricsConfig


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    namespaces = _checked(parser, args)
    _logging(args)
    metrics = _metrics(parser, args)

    import asyncio

    import uvloop

    from .plan import validate

    run = _kopf_run(args, _webhook(args))
    # The CEL parser the spec checks use (about a second of pure-Python work), built before the event loop starts:
    # in a thread it would hold the interpreter's lock as long, and stall the loop all the same.
    validate.warm_up()
    # One event loop for the process, uvloop as kopf's own CLI runs it: the event loop's bookkeeping was a tenth of
    # the operator's CPU at fleet scale with asyncio's pure-Python loop. A shard's restarts run on it too, and the
    # metrics server serves on it across them.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if not args.namespace_selector:
            runner.run(_quietly(_serving(metrics, lambda: run(namespaces))))
            return 0
        from .kube.client import new_api_client
        from .kube.shard import run_shard

        config = new_api_client(args.kubeconfig).configuration
        runner.run(_quietly(_serving(metrics, lambda: run_shard(config, args.namespace_selector, run))))
    return 0


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The flags' combinations the parser alone cannot refuse; the namespaces watched (flags and environment)."""
    if args.leader_elect and not args.leader_election_namespace:
        parser.error("--leader-elect needs --leader-election-namespace (or $ARBITER_OPERATOR_NAMESPACE)")
    if not args.retry_period < args.renew_deadline < args.lease_duration:
        parser.error("leader election needs --retry-period < --renew-deadline < --lease-duration")
    if args.runtime_image:
        os.environ["ARBITER_RUNTIME_IMAGE"] = args.runtime_image  # read by arbiter_operator.settings
    os.environ[METRICS_READER_SECRET_ENV] = args.metrics_reader_secret  # likewise
    os.environ[S3_OWN_CREDENTIALS_ENV] = "true" if args.s3_own_credentials else "false"  # likewise
    os.environ[ARGOCD_NAMESPACE_ENV] = args.argocd_namespace  # likewise
    namespaces = list(args.namespace)
    env_ns = os.environ.get("ARBITER_NAMESPACES", "")
    namespaces += [n.strip() for n in env_ns.split(",") if n.strip()]
    if namespaces and args.namespace_selector:
        parser.error("--namespace and --namespace-selector are exclusive: a shard owns what its selector matches")
    return namespaces


def _metrics(parser: argparse.ArgumentParser, args: argparse.Namespace) -> MetricsConfig | None:
    """Process and Python runtime metrics (prometheus_client's default collectors) plus the operator's own (metrics.py:
    reconciles, work queue, API requests, promotions), served by metrics_server.py; the chart's metrics Service and
    ServiceMonitor scrape them. The certificate is loaded here, before anything starts: a missing or broken one stops
    the operator saying so."""
    if not args.metrics_port:
        return None
    import ssl
    from pathlib import Path

    from .metrics_server import MetricsConfig, ServingCert

    cert = None
    if args.metrics_cert_dir:
        try:
            cert = ServingCert(Path(args.metrics_cert_dir))
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"--metrics-cert-dir {args.metrics_cert_dir}: cannot load tls.crt and tls.key: {exc}")
    return MetricsConfig(port=args.metrics_port, address=args.metrics_address, cert=cert, auth=args.metrics_auth,
                         kubeconfig=args.kubeconfig)


async def _serving(metrics: MetricsConfig | None, run: Callable[[], Awaitable[None]]) -> None:
    """`run()`, with the metrics server (if any) serving for as long as it runs."""
    if metrics is None:
        await run()
        return
    from .metrics_server import serve

    server = await serve(metrics)
    try:
        await run()
    finally:
        await server.stop()


def _webhook(args: argparse.Namespace) -> WebhookConfig | None:
    if not args.webhook_port:
        return None
    from pathlib import Path

    from .admission import WebhookConfig

    return WebhookConfig(port=args.webhook_port, cert_dir=Path(args.webhook_cert_dir), address=args.webhook_address)


def _kopf_run(args: argparse.Namespace, webhook: WebhookConfig | None) -> Callable[..., Awaitable[None]]:
    import asyncio
    import signal

    import kopf

    from . import handlers
    from .app import Operator

    async def run(watched: list[str], stop_flag: asyncio.Event | None = None) -> None:
        """One kopf run over `watched` ([]: cluster-wide), with an Operator of its own: a shard's restart on a new
        namespace list starts from nothing the previous run saw."""
        settings = kopf.OperatorSettings()
        # No cluster-wide scanning: kopf would otherwise list/watch all CRDs (to notice KServe or Routes installed
        # later) and, with --namespace, list/watch all namespaces. Both need cluster-wide grants that the Helm chart's
        # per-namespace Roles mode must not have (docs/security.md). The resources are discovered once at start-up;
        # restart the operator after installing KServe or the Route API.
        settings.scanning.disabled = True
        # kopf itself watches nothing (the operator's watches are its own, kube/watch.py): a shard that owns no
        # namespace runs kopf idle, for its probe server, with the operator told so.
        idle = bool(args.namespace_selector) and not watched
        try:
            await kopf.operator(
                settings=settings,
                registry=handlers.register(kopf.OperatorRegistry(), Operator(_config(args, watched, idle)), webhook),
                standalone=True,
                clusterwide=not watched,
                namespaces=watched,
                liveness_endpoint=args.liveness or None,
                stop_flag=stop_flag,
            )
        finally:
            # kopf's SIGTERM/SIGINT handlers answer a run that is over: between a shard's runs a signal ends the
            # process as it would without kopf.
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().remove_signal_handler(sig)

    return run


async def _quietly(coro: Any) -> None:
    """As kopf.run: a run cancelled on the way out (a signal) is a normal end."""
    import asyncio

    try:
        await coro
    except asyncio.CancelledError:
        pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbiter-operator", description="Arbiter DecisionModel operator")
    _scope_flags(parser)
    _serving_flags(parser)
    _metrics_flags(parser)
    _leader_flags(parser)
    return parser


def _scope_flags(parser: argparse.ArgumentParser) -> None:
    """What the operator watches, how it reaches the apiserver, how much it logs."""
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; also $ARBITER_NAMESPACES, comma-separated); default: all namespaces",
    )
    parser.add_argument(
        "--namespace-selector",
        default=os.environ.get("ARBITER_NAMESPACE_SELECTOR", ""),
        help="own the namespaces whose labels match this label selector (e.g. shard=risk), followed as labels change; "
        "one shard of a large fleet, with its own --leader-election-id (also $ARBITER_NAMESPACE_SELECTOR)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig path, loaded explicitly by kopf and the clients (default: in-cluster, then $KUBECONFIG)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="log level of the operator's own loggers (default: info; --verbose means debug)",
    )


def _serving_flags(parser: argparse.ArgumentParser) -> None:
    """What the operator serves (probes, webhook, metrics) and the runtime image it deploys."""
    parser.add_argument(
        "--liveness",
        default=os.environ.get("ARBITER_LIVENESS", "http://0.0.0.0:8081/healthz"),
        help="liveness endpoint (kopf's probe server); '' disables it",
    )
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=int(os.environ.get("ARBITER_WEBHOOK_PORT", "0")),
        help="serve the validating admission webhook (HTTPS, path /decisionmodels) on this port (0: off); the Helm "
        "chart sets 9443",
    )
    parser.add_argument(
        "--webhook-cert-dir",
        default=os.environ.get("ARBITER_WEBHOOK_CERT_DIR", "/etc/arbiter/webhook-tls"),
        help="directory holding the webhook's tls.crt and tls.key (re-read when they change)",
    )
    parser.add_argument(
        "--webhook-address",
        default=os.environ.get("ARBITER_WEBHOOK_ADDRESS", "0.0.0.0"),
        help="address the webhook listens on (default: all interfaces, for the chart's webhook Service)",
    )
    parser.add_argument(
        "--s3-own-credentials",
        type=_true_or_false,
        default=_true_or_false(os.environ.get(S3_OWN_CREDENTIALS_ENV) or "false"),
        help="read a storage-config entry without keys with the operator's own AWS credentials (botocore's chain: "
        "AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, environment keys, container or instance metadata); also "
        f"${S3_OWN_CREDENTIALS_ENV}, the Helm value aws.ownCredentials; default false",
    )
    parser.add_argument(
        "--runtime-image",
        default=os.environ.get("ARBITER_RUNTIME_IMAGE", ""),
        help="runtime image for newly deployed versions of DecisionModels that set no spec.serving.runtimeImage "
        "(also $ARBITER_RUNTIME_IMAGE; the Helm value runtime.image); default: the image released with the operator",
    )
    parser.add_argument(
        "--argocd-namespace",
        default=os.environ.get(ARGOCD_NAMESPACE_ENV, ""),
        help="the namespace of Argo CD's Applications (argocd; openshift-gitops): a promotion of a DecisionModel "
        f"Argo CD tracks records the Git revision its Application synced (also ${ARGOCD_NAMESPACE_ENV}; the Helm value "
        "argocd.namespace, which grants `get` on applications there); empty: not read",
    )


def _true_or_false(value: str) -> bool:
    word = value.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def _secret_name(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Secret name (a DNS subdomain: lower case letters, "
                                         "digits, '-' and '.')")
    return value


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    """The operator's metrics endpoint, and the credentials Prometheus presents to the runtimes' metrics."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("ARBITER_METRICS_PORT", "0")),
        help="serve Prometheus metrics at /metrics on this port (0: off); the Helm chart sets 9090",
    )
    parser.add_argument(
        "--metrics-address",
        default=os.environ.get("ARBITER_METRICS_ADDRESS", "0.0.0.0"),
        help="address the metrics server listens on (default: all interfaces, for the chart's metrics Service)",
    )
    parser.add_argument(
        "--metrics-auth",
        type=_true_or_false,
        default=os.environ.get("ARBITER_METRICS_AUTH", "true"),  # a string default goes through `type` too
        help="true (default): a scrape needs a bearer token the apiserver authenticates (TokenReview) whose user may "
        "get the non-resource URL /metrics (SubjectAccessReview; the chart's metrics-reader ClusterRole grants it), "
        "else 401 or 403; false: anyone who reaches the port reads the metrics, for local development only (also "
        "$ARBITER_METRICS_AUTH)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        default=os.environ.get("ARBITER_METRICS_CERT_DIR", ""),
        help="directory holding the metrics server's tls.crt and tls.key: HTTPS, the files re-read when they change "
        "(the Helm chart mounts the service CA's certificate on OpenShift). Empty (default): plain HTTP, the only "
        "case it is allowed, for local development: bearer tokens then cross the network unencrypted (also "
        "$ARBITER_METRICS_CERT_DIR)",
    )
    parser.add_argument(
        "--metrics-reader-secret",
        type=_secret_name,
        default=os.environ.get(METRICS_READER_SECRET_ENV) or DEFAULT_METRICS_READER_SECRET,
        help="for DecisionModels with spec.exposure.auth, the Secret in the model's namespace (key `token`) whose "
        "bearer token Prometheus presents to the runtimes' metrics: the PodMonitor's authorization (also "
        f"${METRICS_READER_SECRET_ENV}; the Helm value metrics.readerSecret; default {DEFAULT_METRICS_READER_SECRET})",
    )


def _leader_flags(parser: argparse.ArgumentParser) -> None:
    """Leader election among replicas (a Lease, client-go's protocol)."""
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("ARBITER_LEADER_ELECT", "") in ("1", "true", "True"),
        help="run as one of several replicas: only the holder of the leader Lease reconciles and writes "
        "(also $ARBITER_LEADER_ELECT=true; the Helm chart turns it on)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("ARBITER_OPERATOR_NAMESPACE", ""),
        help="namespace of the leader Lease (default: $ARBITER_OPERATOR_NAMESPACE, the chart's release namespace)",
    )
    parser.add_argument(
        "--leader-election-id",
        default=os.environ.get("ARBITER_LEADER_ELECTION_ID", "arbiter-operator-leader"),
        help="name of the leader Lease; each shard needs its own (default arbiter-operator-leader)",
    )
    parser.add_argument("--lease-duration", type=float, default=float(os.environ.get("ARBITER_LEASE_DURATION", "15")),
                        help="seconds a standby waits on an unrenewed Lease before taking it (default 15)")
    parser.add_argument("--renew-deadline", type=float, default=float(os.environ.get("ARBITER_RENEW_DEADLINE", "10")),
                        help="seconds after its last renewal the leader stops writing and exits (default 10)")
    parser.add_argument("--retry-period", type=float, default=float(os.environ.get("ARBITER_RETRY_PERIOD", "2")),
                        help="seconds between renewals / acquisition attempts (default 2)")


def _logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else getattr(logging, (args.log_level or "info").upper())
    debug = level <= logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # The format names no thread, process or source line: the logging module need not look them up for every record
    # (the "Optimization" knobs of Python's logging HOWTO; every write is logged, so this is per request).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    # kopf logs its start-up steps and each hook's run at INFO; keep the operator's own story readable.
    logging.getLogger("kopf").setLevel(logging.INFO if debug else max(level, logging.WARNING))
    # httpx logs every request (registry, Prometheus) at INFO; the analysis and registry lines tell the story once.
    logging.getLogger("httpx").setLevel(logging.DEBUG if debug else max(level, logging.WARNING))


def _config(args: argparse.Namespace, watched: list[str], idle: bool = False) -> OperatorConfig:
    """What one kopf run is built from. The kubeconfig path travels in it to the login handler and the clients
    (handlers.py, app.py), explicitly: no process-wide $KUBECONFIG that would depend on when the kubernetes library
    first reads it."""
    from .app import LeaderConfig, OperatorConfig

    if idle:  # a shard that owns no namespace: nothing to watch or reconcile, no Lease to campaign for
        return OperatorConfig(kubeconfig=args.kubeconfig, idle=True)
    leader = None
    if args.leader_elect:
        from .kube import client as kube
        from .kube.leader import default_identity

        identity = default_identity()
        kube.USER_AGENT = f"arbiter-operator/{identity}"
        leader = LeaderConfig(namespace=args.leader_election_namespace, name=args.leader_election_id,
                              identity=identity, lease_duration=args.lease_duration,
                              renew_deadline=args.renew_deadline, retry_period=args.retry_period)
    # The children's watches follow kopf's scope.
    return OperatorConfig(kubeconfig=args.kubeconfig, namespaces=list(watched), leader=leader)


if __name__ == "__main__":
    sys.exit(main())
