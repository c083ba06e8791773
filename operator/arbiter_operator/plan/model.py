"""Plain data in and out of the planner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api.conditions import Condition
from ..api.conditions import Event as Event  # re-exported: the planner's events
from ..api.models import DEFAULT_METRICS_READER_SECRET, DEFAULT_RUNTIME_IMAGE
from ..api.names import RAW_DEPLOYMENT
from ..api.promotion import AnalysisRun
from ..promotion.model import PromotionRequest


@dataclass(frozen=True)
class ArtifactObservation:
    """Result of the artifact check on storage for one version (filled by the registry/S3 part)."""

    valid: bool | None = True  # None: not checked yet (nothing is deployed for the version until it is known)
    reason: str = ""
    message: str = ""
    digest: str | None = None
    diffusion: bool = False
    tokens_per_decision: int | None = None  # scored mode, from the version's tokenizer (plan/tokencost.py)
    storage_key: str | None = None  # the storage-config entry the check read with; KServe is told to use it too


ChildKey = tuple[str, str]  # (kind, name)


@dataclass(frozen=True)
class Observations:
    """What exists, as read by arbiter_operator.observe."""

    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    # The DecisionModel's own children (controlled by it, by uid), keyed by (kind, name): what observe/children.py's
    # table of child kinds found. A kind the planner renders only sometimes (the shadow phase's Role and RoleBinding,
    # a PodMonitor) is here only while it exists.
    children: Mapping[ChildKey, dict[str, Any]] = field(default_factory=dict)
    # The PodMonitor API (prometheus-operator) is served: render one; without it, monitoring is simply not set up.
    podmonitor_api: bool = False
    # The same for PrometheusRules: render the model's alerts (render/prometheusrule.py).
    prometheusrule_api: bool = False
    # Filled by other parts (registry, artifact check, Prometheus analysis); neutral defaults keep serving going.
    artifacts: Mapping[str, ArtifactObservation] = field(default_factory=dict)
    registry_ids: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    extra_conditions: tuple[Condition, ...] = ()  # e.g. Registered, ArtifactsValid, computed where they are observed
    analysis: AnalysisRun | None = None
    # The operator's runtime image setting (--runtime-image / $ARBITER_RUNTIME_IMAGE): what a newly deployed version
    # runs.
    default_runtime_image: str = DEFAULT_RUNTIME_IMAGE
    # The operator's metrics-reader Secret setting (--metrics-reader-secret / $ARBITER_METRICS_READER_SECRET): the
    # Secret, in the model's namespace, whose token the PodMonitor presents to runtimes with spec.exposure.auth.
    metrics_reader_secret: str = DEFAULT_METRICS_READER_SECRET
    # The predictor workloads KServe made, keyed by InferenceService name: its `<isvc>-predictor` Deployment and,
    # for InferenceServices that are not ready, their pods (why they do not serve). workloads_observed False (no
    # permission, or plain unit data): readiness comes from the InferenceService alone.
    workloads_observed: bool = False
    predictor_deployments: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    predictor_pods: Mapping[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    # KServe's predictor Services (`<isvc>-predictor`), keyed by Service name, where seen: whether the Route's target
    # port is there (plan/exposure.py).
    predictor_services: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # Who asked for the promotion a pass starts (observe/requester.py): read only when a first plan of the pass
    # starts one (Plan.needs_request), then the pass plans again with it.
    promotion_request: PromotionRequest | None = None
    # The name KServe accepts for its plain-Deployment mode (observe/kserve.py): `RawDeployment` until KServe's
    # webhook has answered with `Standard`.
    kserve_deployment_mode: str = RAW_DEPLOYMENT

    def of_kind(self, kind: str) -> dict[str, dict[str, Any]]:
        """The observed children of one kind, by name."""
        return {name: obj for (k, name), obj in self.children.items() if k == kind}

    def one(self, kind: str) -> dict[str, Any] | None:
        """The observed child of a kind the DecisionModel has one of (its Route, its stable Service), if any."""
        return next((obj for (k, _), obj in sorted(self.children.items()) if k == kind), None)


def children_of(*objs: dict[str, Any], **by_kind: Mapping[str, dict[str, Any]]) -> dict[ChildKey, dict[str, Any]]:
    """Children keyed as Observations holds them: objects by their own kind and name, and {name: object} maps by
    the kind they are named after (e.g. `children_of(route, InferenceService={name: isvc})`)."""
    out = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    out.update({(kind, name): o for kind, named in by_kind.items() for name, o in named.items()})
    return out


@dataclass(frozen=True)
class Plan:
    # None: leave every child as it is (the spec cannot be served as written; nothing that serves may change).
    children: list[dict[str, Any]] | None
    deletions: list[tuple[str, str, str]]  # (apiVersion, kind, name) of owned children no longer wanted
    status: dict[str, Any]  # the whole .status, JSON-ready
    events: list[Event]
    requeue_after: float | None
    # This plan starts a promotion and who asked for it was not read: read it (managedFields, Argo CD) and plan again.
    needs_request: bool = False
