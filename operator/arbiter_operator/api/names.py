"""Every name the operator shares with the cluster: API groups and kinds, labels, annotations, field managers.

The one copy: the operator, its renderers and the kubectl plugin import these; nothing else spells them.
"""

from __future__ import annotations

from typing import Final

# The DecisionModel API.
GROUP: Final = "arbiter.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DecisionModel"
PLURAL: Final = "decisionmodels"

# Server-side apply field managers (and the component on the operator's Events).
FIELD_MANAGER: Final = "arbiter-operator"
CLI_FIELD_MANAGER: Final = "kubectl-arbiter"

# The runtime's contract: the key of the per-version ConfigMap the runtime reads (docs/architecture.md).
CONFIG_FILE: Final = "decision.json"

# Labels on every child.
LABEL_DM: Final = "arbiter.dev/decision-model"
LABEL_VERSION: Final = "arbiter.dev/version"
LABEL_COMPONENT: Final = "arbiter.dev/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
MANAGED_BY: Final = "arbiter-operator"

# Annotations the operator writes on children.
ANN_CONFIG_CHECKSUM: Final = "arbiter.dev/decision-config-checksum"
ANN_APPLIED_HASH: Final = "arbiter.dev/applied-hash"

# Annotations a user (or kubectl arbiter) sets on a DecisionModel; GitOps-safe, no spec change.
RETRY_ANNOTATION: Final = "arbiter.dev/retry"
# Abort without editing spec: a new value rolls a running promotion back; see docs/operations.md.
ABORT_ANNOTATION: Final = "arbiter.dev/abort"
# Manual gate (approval: Required): `<candidate version>` or `<candidate version>@<anything>`, set after the promotion
# started, lets a Paused promotion take all traffic; kubectl arbiter approve writes `<version>@<time>`.
APPROVE_ANNOTATION: Final = "arbiter.dev/approve"

# Argo CD's annotation on the objects it tracks (annotation tracking, its default): `<app>:<group>/<kind>:<ns>/<name>`,
# `<app>` being `<namespace>_<name>` for an Application outside Argo CD's own namespace.
ARGOCD_TRACKING_ANNOTATION: Final = "argocd.argoproj.io/tracking-id"

# Labels OpenShift AI uses to link a deployment to its Model Registry entry.
LABEL_REGISTERED_MODEL_ID: Final = "modelregistry.opendatahub.io/registered-model-id"
LABEL_MODEL_VERSION_ID: Final = "modelregistry.opendatahub.io/model-version-id"
LABEL_REGISTRY_NAME: Final = "modelregistry.opendatahub.io/name"
LABEL_REGISTRY_NAMESPACE: Final = "modelregistry.opendatahub.io/namespace"
ANN_REGISTRY_URL: Final = "modelregistry.opendatahub.io/url"
# odh-model-controller's finalizer on InferenceServices that carry the registry labels (docs/registry.md).
REGISTRY_ISVC_FINALIZER: Final = "modelregistry.opendatahub.io/finalizer"

# KServe's label on the predictor Deployment and its pods.
ISVC_LABEL: Final = "serving.kserve.io/inferenceservice"
# KServe's deployment mode annotation, and the two names its lines give the plain-Deployment mode: `RawDeployment`
# (every line; KServe 0.16+ keeps it as a legacy name and its defaulting webhook rewrites it) and `Standard` (0.16+
# only; the 0.15 line behind OpenShift AI 2.x and Open Data Hub up to 3.3 falls back to its default mode for it).
ANN_DEPLOYMENT_MODE: Final = "serving.kserve.io/deploymentMode"
RAW_DEPLOYMENT: Final = "RawDeployment"
STANDARD: Final = "Standard"

# Other APIs the operator reads or writes.
CORE_API: Final = "v1"
APPS_API: Final = "apps/v1"
ISVC_API: Final = "serving.kserve.io/v1beta1"
SERVINGRUNTIME_API: Final = "serving.kserve.io/v1alpha1"
ROUTE_API: Final = "route.openshift.io/v1"
PODMONITOR_API: Final = "monitoring.coreos.com/v1"
PODMONITOR_KIND: Final = "PodMonitor"
PROMETHEUSRULE_KIND: Final = "PrometheusRule"  # same API group and version as PodMonitor
RBAC_API: Final = "rbac.authorization.k8s.io/v1"
NETWORKING_API: Final = "networking.k8s.io/v1"
COORDINATION_API: Final = "coordination.k8s.io/v1"
MODEL_REGISTRY_API: Final = "modelregistry.opendatahub.io/v1beta1"
ARGOCD_API: Final = "argoproj.io/v1alpha1"
