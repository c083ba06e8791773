"""Pure builders: (DecisionModel, observations) -> child manifests as plain dicts. No I/O here."""

from .common import FIELD_MANAGER, configmap_name, predictor_service, runtime_name
from .configmap import decision_config, render_configmap
from .inferenceservice import PredictorInputs, render_inferenceservice, vllm_args
from .mesh import namespace_injected, sidecar_settings
from .podmonitor import podmonitor_name, render_podmonitor
from .prometheusrule import prometheusrule_name, render_prometheusrule
from .route import render_route
from .service import render_stable_service, stable_service_name, stable_service_url
from .servingruntime import render_servingruntime

__all__ = [
    "FIELD_MANAGER",
    "PredictorInputs",
    "configmap_name",
    "decision_config",
    "namespace_injected",
    "podmonitor_name",
    "predictor_service",
    "prometheusrule_name",
    "render_configmap",
    "render_inferenceservice",
    "render_podmonitor",
    "render_prometheusrule",
    "render_route",
    "render_servingruntime",
    "render_stable_service",
    "runtime_name",
    "sidecar_settings",
    "stable_service_name",
    "stable_service_url",
    "vllm_args",
]
