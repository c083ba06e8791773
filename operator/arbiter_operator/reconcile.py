"""One reconcile of one DecisionModel, used by every trigger (level-based), in four steps read top to bottom:

  observe  the children in the cluster (observe.children), the artifacts on S3 (observe.storage) and, when a
           promotion step is due one, the canary analysis in Prometheus (observe.analysis);
  sync     the Model Registry entries (sync.registry): the one write outside the cluster;
  plan     desired children and status from spec + observations + now (plan.plan, pure);
  apply    server-side apply of the children, then the status (apply.apply_plan).

One clock: `now` is read once, before observing, and passed to every step that needs a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from .api.kubejson import REFUSED
from .api.models import DEFAULT_METRICS_READER_SECRET, DEFAULT_RUNTIME_IMAGE, DecisionModel
from .api.names import API_VERSION, KIND
from .apply import apply_plan
from .kube.client import KubeClient
from .observe.analysis import InstantQuerier, observe_promotion_analysis
from .observe.audit import AuditVerdicts, observe_audit
from .observe.children import observe_children, podmonitor_served, prometheusrule_served
from .observe.kserve import DeploymentModes
from .observe.requester import observe_request
from .observe.storage import VerdictCache, observe_artifacts
from .plan import plan as make_plan
from .refuse import invalid_message, refuse, undecodable_message
from .registry_handlers import RegistryFinalizer
from .registry_handlers import holds as registry_holds
from .sync.registry import sync_registry_step

log = logging.getLogger("arbiter.reconcile")

CONFLICT_RECHECK_SECONDS = 60.0


def utc_now() -> datetime:
    return datetime.now(UTC)


class Finalizer(Protocol):
    async def finalize(self, raw: dict[str, Any], now: datetime) -> float | None: ...

    async def keep(self, raw: dict[str, Any], dm: DecisionModel) -> None: ...


class Reconciler:
    def __init__(
        self,
        client: KubeClient,
        clock: Callable[[], datetime] = utc_now,
        finalizer: Finalizer | None = None,
        prometheus: InstantQuerier | None = None,
        runtime_image: str = DEFAULT_RUNTIME_IMAGE,
        metrics_reader_secret: str = DEFAULT_METRICS_READER_SECRET,
        verdicts: VerdictCache | None = None,
        argocd_namespace: str | None = None,
    ):
        """prometheus: where canary analyses are read (None: no analysis runs; a step due one waits for it).
        runtime_image: the operator's default runtime image (settings.runtime_image()).
        metrics_reader_secret: the Secret whose token the PodMonitors of models with auth on present
        (settings.metrics_reader_secret()).
        verdicts: settled artifact verdicts kept between reconciles (one per process; the default keeps 5 min).
        argocd_namespace: where Argo CD's Applications are (settings.argocd_namespace()): a promotion of a DecisionModel
        Argo CD tracks records the revision its Application synced."""
        self.client = client
        # The registry's delete finalizer (registry_handlers.RegistryFinalizer): held while spec.registry is set,
        # run when the DecisionModel is deleted. Handled here, in the one reconcile, so nothing else writes to it.
        self.finalizer: Finalizer = finalizer if finalizer is not None else RegistryFinalizer(client)
        self.clock = clock
        self.prometheus = prometheus
        self.runtime_image = runtime_image
        self.metrics_reader_secret = metrics_reader_secret
        self.verdicts = verdicts if verdicts is not None else VerdictCache()
        self.argocd_namespace = argocd_namespace
        self.audits = AuditVerdicts()  # the audit bucket's settled verdicts (spec.audit)
        self._seen: set[tuple[str, str]] = set()
        # Whether the PodMonitor API is served, observed once (None until known). Like every other API the operator
        # uses, it is discovered at start-up: restart the operator after installing prometheus-operator.
        self.podmonitor_api: bool | None = None
        self.prometheusrule_api: bool | None = None  # the same for PrometheusRules (the model's alerts)
        # The name KServe gives its plain-Deployment mode, learnt from what its webhook kept (observe/kserve.py).
        self.deployment_modes = DeploymentModes()

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Returns seconds until the next reconcile the plan asks for (None: only on change)."""
        # From the watch cache when there is one (no request); a plain client reads from the apiserver.
        raw = await self.client.aheld(API_VERSION, KIND, namespace, name)
        if raw is None:
            return None
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            # Children go with it (owner references); what lives outside the cluster is the finalizer's.
            return await self.finalizer.finalize(raw, self.clock()) if registry_holds(raw) else None
        # One the operator cannot read (nested deeper than its decoders go: held as a stand-in), or whose spec its API
        # refuses (a schema nested too deep, or a CRD older than this operator): its status says so, and no child is
        # touched.
        if REFUSED in raw:
            await refuse(self.client, raw, undecodable_message(raw), self.clock())
            return None
        try:
            dm = DecisionModel.model_validate(raw)
        except ValidationError as exc:
            await refuse(self.client, raw, invalid_message(exc), self.clock())
            return None
        await self.finalizer.keep(raw, dm)
        if self.podmonitor_api is None:
            self.podmonitor_api = await podmonitor_served(self.client)
            if self.podmonitor_api is False:
                log.info("the PodMonitor API (monitoring.coreos.com/v1) is not served: no PodMonitors are created")
        if self.prometheusrule_api is None:
            self.prometheusrule_api = await prometheusrule_served(self.client)
            if self.prometheusrule_api is False:
                log.info("the PrometheusRule API (monitoring.coreos.com/v1) is not served: no model alerts are made")
        now = self.clock()
        # observe
        obs = await observe_children(self.client, dm, bool(self.podmonitor_api), self.runtime_image,
                                     prometheusrule_api=bool(self.prometheusrule_api),
                                     metrics_reader_secret=self.metrics_reader_secret)
        obs = replace(obs, kserve_deployment_mode=self.deployment_modes.mode_for(
            obs.of_kind("InferenceService").values()))
        # (artifacts first: nothing is deployed for a version until its artifacts are known valid)
        obs = await observe_artifacts(self.client, dm, obs, now, self.verdicts)
        # (the audit bucket before the plan: a version whose required audit is not ready is not promoted)
        obs = await observe_audit(self.client, dm, obs, now, self.audits, self.verdicts.secrets, self.verdicts.storages)
        if self.prometheus is not None:
            obs = await observe_promotion_analysis(self.prometheus, dm, obs, now)
        # sync (registry ids label the InferenceServices the plan renders)
        obs = await sync_registry_step(self.client, dm, obs, now)
        # plan
        p = make_plan(dm, obs, now)
        if p.needs_request:
            # A promotion starts in this pass: who asked (managedFields, Argo CD's revision) goes into its status and,
            # when it ends, its history record. Read only now, so a converged pass still makes no request.
            request = await observe_request(self.client, dm, self.argocd_namespace)
            p = make_plan(dm, replace(obs, promotion_request=request), now)
        # apply
        writes, conflicts = await apply_plan(self.client, raw, dm, p, dict(obs.children), now)
        # INFO when something changed, and once per DecisionModel after start (so a restart's reconcile is visible);
        # the polls in between stay at DEBUG.
        first = (namespace, name) not in self._seen
        self._seen.add((namespace, name))
        log.log(logging.INFO if writes or first else logging.DEBUG, "reconciled %s/%s: %d writes, requeue %s",
                namespace, name, writes, p.requeue_after)
        if conflicts:  # nothing watches the other owner's object: look again now and then
            return min(p.requeue_after or CONFLICT_RECHECK_SECONDS, CONFLICT_RECHECK_SECONDS)
        return p.requeue_after
