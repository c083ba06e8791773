"""Thin kopf glue: kopf runs the operator's log-in, start-up and clean-up, its liveness probe, and (when configured) its
validating admission webhook (admission.py); start-up and clean-up hand over to the composition root (app.Operator),
which builds and stops the watches, the triggers, the work queue and the workers. `register` puts the three handlers
into one kopf registry per run, bound to that run's Operator: no state in kopf's memo, none at module level.

Why no kopf resource handler: kopf's change handlers store progress and diff-base annotations on the object, its
daemons and timers add a finalizer, i.e. they write to the DecisionModel on their own, and its per-event machinery
(a Body, a logger, an index and handler bookkeeping per event) cost more CPU than what the operator does with an
event. A level-based reconcile needs none of it, and a converged DecisionModel then sees zero writes. The registry's
delete finalizer is part of that reconcile too (registry_handlers.RegistryFinalizer).
"""

from __future__ import annotations

from typing import Any

import kopf

from . import admission
from .admission import WebhookConfig
from .api.backoff import RECONCILE_ERROR_BACKOFF
from .app import Operator
from .kube.client import new_api_client


def configure(settings: kopf.OperatorSettings, webhook: WebhookConfig | None = None) -> None:
    # kopf would post log lines as Events; Arbiter posts its own on transitions.
    settings.posting.enabled = False
    settings.networking.error_backoffs = RECONCILE_ERROR_BACKOFF.schedule(5)
    if webhook is not None:
        admission.configure(settings, webhook)


def register(registry: kopf.OperatorRegistry, operator: Operator,
             webhook: WebhookConfig | None = None) -> kopf.OperatorRegistry:
    """kopf's log-in, start-up and clean-up for one run of `operator`, in `registry`; with `webhook`, the admission
    handler too (kopf refuses to start with an admission handler and no server, so both or neither)."""
    if webhook is not None:
        admission.register(registry)

    @kopf.on.login(registry=registry)
    def login(logger: Any, settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
        """kopf's own connection: from --kubeconfig when given (the same file the clients load), else kopf's default
        (in-cluster, then $KUBECONFIG). Registering a login handler replaces kopf's defaults, hence the delegation."""
        path = operator.config.kubeconfig
        if not path:
            return kopf.login_via_client(logger=logger, settings=settings, **kwargs)
        return connection_info(new_api_client(path).configuration, settings.networking.trust_env)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, webhook)
        await operator.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await operator.stop()

    return registry


def connection_info(config: Any, trust_env: bool) -> kopf.ConnectionInfo:
    """A kubernetes.client.Configuration as kopf credentials (as kopf.login_via_client reads the default one)."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        trust_env=trust_env,
    )
