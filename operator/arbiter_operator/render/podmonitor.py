"""The PodMonitor (monitoring.coreos.com/v1) that lets Prometheus scrape a DecisionModel's predictor pods.

One per DecisionModel, in its namespace, named after it and owned by it. OpenShift user-workload monitoring picks it
up and attaches `namespace` to every target; `podTargetLabels` copies the pods' `arbiter.dev/decision-model` and
`arbiter.dev/version` labels onto the series (as `arbiter_dev_decision_model`, `arbiter_dev_version`), which is how the
promotion analysis selects one version's numbers (docs/operations.md, "Promotion metrics").

Two endpoints on the runtime's port: `/metrics` (the decision server's own) and `/metrics/vllm`, where the runtime
re-exports vLLM's `vllm:` series (vLLM listens on 127.0.0.1 inside the pod, out of Prometheus' reach): KV-cache use,
queue time, time to first token, end-to-end latency, each with the same version labels.
Rendered only where the PodMonitor API is served (the planner decides from what the operator observed).

With spec.exposure.auth the runtime answers a scrape only with a bearer token whose user may `get` the non-resource
URL /metrics (arbiter_runtime/auth.py), so each endpoint carries `authorization` from a Secret in the model's
namespace (key `token`), named by the operator's --metrics-reader-secret: OpenShift user-workload monitoring refuses
`bearerTokenFile` (a file of Prometheus' own pod), and a Secret is how it takes credentials. The Secret is a
ServiceAccount token bound to the chart's metrics-reader ClusterRole (docs/install.md); without it Prometheus skips
the targets and the promotion analysis finds no data.
"""

from __future__ import annotations

from typing import Any

from ..api.models import DEFAULT_METRICS_READER_SECRET, DecisionModel
from ..api.names import PODMONITOR_API, PODMONITOR_KIND
from .common import LABEL_DM, LABEL_VERSION, SERVING_PORT_NAME, metadata

API_VERSION = PODMONITOR_API
KIND = PODMONITOR_KIND
METRICS_PATH = "/metrics"
VLLM_METRICS_PATH = "/metrics/vllm"  # vLLM's own series, re-exported by the runtime (runtime/vllm_metrics.py)
# prometheus-operator labels each target with `endpoint`: the port's name, the same for both endpoints here, so their
# `up` and scrape_* series would be one series written by two scrape jobs (a failing vLLM scrape flapping with a
# healthy one). The second endpoint names itself.
VLLM_ENDPOINT = "vllm"
VLLM_ENDPOINT_LABEL = {"action": "replace", "targetLabel": "endpoint", "replacement": VLLM_ENDPOINT}
READER_SECRET_KEY = "token"  # the key a kubernetes.io/service-account-token Secret holds its token under


def podmonitor_name(dm_name: str) -> str:
    return dm_name


def render_podmonitor(dm: DecisionModel, reader_secret: str = DEFAULT_METRICS_READER_SECRET) -> dict[str, Any]:
    """reader_secret: the Secret whose `token` the scrapes present when the runtime checks them (spec.exposure.auth)."""
    auth = {"authorization": {"type": "Bearer", "credentials": {"name": reader_secret, "key": READER_SECRET_KEY}}} \
        if dm.spec.exposure.auth else {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(dm, podmonitor_name(dm.metadata.name), "podmonitor"),
        "spec": {
            "selector": {"matchLabels": {LABEL_DM: dm.metadata.name}},
            "podTargetLabels": [LABEL_DM, LABEL_VERSION],
            # By the container port's name (the ServingRuntime's `http1`, 8080): `port` is understood by every
            # prometheus-operator release OpenShift ships, unlike the newer `portNumber`.
            "podMetricsEndpoints": [
                {"port": SERVING_PORT_NAME, "path": METRICS_PATH, "scheme": "http", **auth},
                {"port": SERVING_PORT_NAME, "path": VLLM_METRICS_PATH, "scheme": "http", **auth,
                 "relabelings": [VLLM_ENDPOINT_LABEL]},
            ],
        },
    }
