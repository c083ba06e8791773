"""One reconcile of one DecisionModel: observe -> plan -> apply. Used by every trigger (level-based)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import ValidationError

from .api.models import API_VERSION, KIND, DecisionModel
from .apply import apply_plan
from .clients.kube import KubeClient
from .observe import observe_children, podmonitor_served, run_observers
from .plan import plan as make_plan
from .plan.model import Observations
from .registry_handlers import holds as registry_holds

log = logging.getLogger("arbiter.reconcile")

CONFLICT_RECHECK_SECONDS = 60.0


def _live_children(obs: Observations) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name, o in obs.inferenceservices.items():
        out[("InferenceService", name)] = o
    for name, o in obs.configmaps.items():
        out[("ConfigMap", name)] = o
    if obs.servingruntime is not None:
        out[("ServingRuntime", obs.servingruntime["metadata"]["name"])] = obs.servingruntime
    if obs.route is not None:
        out[("Route", obs.route["metadata"]["name"])] = obs.route
    if obs.podmonitor is not None:
        out[("PodMonitor", obs.podmonitor["metadata"]["name"])] = obs.podmonitor
    if obs.stable_service is not None:
        out[("Service", obs.stable_service["metadata"]["name"])] = obs.stable_service
    out.update(obs.shadow_rbac)
    return out


class Reconciler:
    def __init__(self, client: KubeClient, clock: Callable[[], datetime] | None = None, finalizer: Any = None):
        self.client = client
        # The registry's delete finalizer (registry_handlers.RegistryFinalizer): held while spec.registry is set,
        # run when the DecisionModel is deleted. Handled here, in the one reconcile, so nothing else writes to it.
        if finalizer is None:
            from .registry_handlers import RegistryFinalizer

            finalizer = RegistryFinalizer(client)
        self.finalizer = finalizer
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._seen: set[tuple[str, str]] = set()
        # Whether the PodMonitor API is served, observed once (None until known). Like every other API the operator
        # uses, it is discovered at start-up: restart the operator after installing prometheus-operator.
        self.podmonitor_api: bool | None = None

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Returns seconds until the next reconcile the plan asks for (None: only on change)."""
        raw = await asyncio.to_thread(self.client.get, API_VERSION, KIND, namespace, name)
        if raw is None:
            return None
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            # Children go with it (owner references); what lives outside the cluster is the finalizer's.
            return await self.finalizer.finalize(raw) if registry_holds(raw) else None
        try:
            dm = DecisionModel.model_validate(raw)
        except ValidationError as exc:
            # The apiserver validated it, so this means the CRD and the operator disagree (version skew).
            log.error("%s/%s does not match this operator's API: %s", namespace, name, exc.errors()[:3])
            return None
        await self.finalizer.keep(raw, dm)
        if self.podmonitor_api is None:
            self.podmonitor_api = await asyncio.to_thread(podmonitor_served, self.client)
            if self.podmonitor_api is False:
                log.info("the PodMonitor API (monitoring.coreos.com/v1) is not served: no PodMonitors are created")
        obs = await asyncio.to_thread(observe_children, self.client, dm, bool(self.podmonitor_api))
        obs = await run_observers(dm, obs)
        now = self.clock()
        p = make_plan(dm, obs, now)
        writes, conflicts = await asyncio.to_thread(apply_plan, self.client, raw, dm, p, _live_children(obs), now)
        # INFO when something changed, and once per DecisionModel after start (so a restart's reconcile is visible);
        # the polls in between stay at DEBUG.
        first = (namespace, name) not in self._seen
        self._seen.add((namespace, name))
        log.log(logging.INFO if writes or first else logging.DEBUG, "reconciled %s/%s: %d writes, requeue %s",
                namespace, name, writes, p.requeue_after)
        if conflicts:  # nothing watches the other owner's object: look again now and then
            return min(p.requeue_after or CONFLICT_RECHECK_SECONDS, CONFLICT_RECHECK_SECONDS)
        return p.requeue_after
