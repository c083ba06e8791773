"""One InferenceService per live version (KServe's plain-Deployment mode, vLLM through the Arbiter runtime)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.models import GPU_PRODUCT_LABEL, DecisionModel, ModelVersion, effective_vllm, engine_memory_share, isvc_name
from ..api.names import (
    ANN_DEPLOYMENT_MODE,
    ANN_REGISTRY_URL,
    LABEL_MODEL_VERSION_ID,
    LABEL_REGISTERED_MODEL_ID,
    LABEL_REGISTRY_NAME,
    LABEL_REGISTRY_NAMESPACE,
    RAW_DEPLOYMENT,
)
from .common import (
    ANN_CONFIG_CHECKSUM,
    CONFIG_DIR,
    CONFIG_FILE,
    LIVE_FILES,
    MODEL_DIR,
    SERVING_PORT,
    VLLM_PORT,
    base_labels,
    checksum,
    configmap_name,
    metadata,
    runtime_name,
)
from .identity import identity_env, identity_mounts, identity_volumes, pod_account
from .mesh import namespace_injected, sidecar_settings
from .service import stable_service_url
from .servingruntime import MODEL_FORMAT

ENABLE_AUTH = "security.opendatahub.io/enable-auth"
# OpenShift AI's dashboard lists (and the Model Registry's deployments view links) only InferenceServices with it.
DASHBOARD = "opendatahub.io/dashboard"
# The dashboard shows it in a deployment's details, beside the endpoints it lists: KServe's per-version address.
DESCRIPTION = "openshift.io/description"
SHM_SIZE = "4Gi"  # NCCL's shared-memory transport between tensor-parallel ranks


def vllm_args(dm: DecisionModel, version: ModelVersion | None = None, diffusion: bool = False) -> list[str]:
    """The `vllm serve` arguments of a version (its own vLLM settings over spec.serving.vllm)."""
    s = dm.spec.serving
    v = effective_vllm(s.vllm, version.vllm if version is not None else None)
    args = [
        MODEL_DIR,
        f"--served-model-name={dm.spec.model.name}",
        f"--port={VLLM_PORT}",
        f"--tensor-parallel-size={s.gpus}",
        f"--dtype={v.dtype}",
    ]
    # Rendered only when asked for, so the arguments (and the pods) of a version that asks for neither stay as
    # they were before these settings existed.
    if v.quantization != "auto":
        args.append(f"--quantization={v.quantization}")
    if v.kvCacheDtype != "auto":
        args.append(f"--kv-cache-dtype={v.kvCacheDtype}")
    args += [
        f"--max-model-len={v.maxModelLen}",
        f"--max-num-seqs={v.maxNumSeqs}",
        f"--block-size={v.blockSize}",
        f"--gpu-memory-utilization={engine_memory_share(v.gpuMemoryUtilization, v.engines)}",
    ]
    if s.nodes > 1:
        args += [f"--pipeline-parallel-size={s.nodes}", "--distributed-executor-backend=ray"]
    if v.enforceEager:
        args.append("--enforce-eager")
    if v.apiServers > 1:
        args.append(f"--api-server-count={v.apiServers}")
    if not diffusion:
        # vLLM 0.26's diffusion models reject a seed and structured outputs; the runtime validates after generation.
        args.append(f"--seed={v.seed}")
        args.append(f"--structured-outputs-config.backend={v.structuredOutputsBackend}")
    args += list(v.extraArgs)
    return args


def _probes() -> dict[str, Any]:
    def http(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": SERVING_PORT, "scheme": "HTTP"}}

    return {
        # Loading tens of GB of weights into GPUs takes minutes: the startup probe allows 30 minutes before
        # liveness starts counting, so a slow load is never killed half-way.
        "startupProbe": {**http("/v2/health/live"), "periodSeconds": 10, "failureThreshold": 180, "timeoutSeconds": 5},
        "livenessProbe": {**http("/v2/health/live"), "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "readinessProbe": {**http("/v2/health/ready"), "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
    }


def _container_security() -> dict[str, Any]:
    # Fits OpenShift's restricted-v2 SCC: no user id is set, so the SCC assigns one from the namespace's range.
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        # The runtime image keeps HOME and every vLLM/torch/Triton/Hugging Face cache under /tmp (Dockerfile.runtime),
        # which is an emptyDir: nothing else is written, so the root filesystem stays read-only.
        "readOnlyRootFilesystem": True,
    }


STORAGE_SECRET_ANNOTATION = "serving.kserve.io/storageSecretName"


def model_storage(dm: DecisionModel, version: ModelVersion, storage_key: str | None = None) -> dict[str, Any]:
    """Where KServe's storage initializer gets the weights, with the credentials the artifact check used.

    For `s3://` KServe injects credentials only in its storage-spec form (`model.storage`: an entry of the
    storage-config Secret plus parameters); a bare `storageUri` gets only what the pod's ServiceAccount carries. So an
    s3 version is rendered as `storage` with the Secret entry the check read (`storage_key`; else `spec.storage.key`,
    else `default`, KServe's own default), the bucket, and `spec.storage` endpoint/region overrides. Other schemes
    (pvc://, oci://, hf://) keep `storageUri`.
    """
    uri = version.storageUri
    if not uri.startswith("s3://"):
        return {"storageUri": uri}
    bucket, _, path = uri.removeprefix("s3://").partition("/")
    st = dm.spec.storage
    parameters = {"type": "s3", "bucket": bucket}
    if st.endpoint:
        parameters["endpoint_url"] = st.endpoint
    if st.region:
        parameters["region"] = st.region
    return {"storage": {"key": storage_key or st.key or "default", "path": path.strip("/"), "parameters": parameters}}


@dataclass(frozen=True)
class PredictorInputs:
    """What one version's InferenceService is rendered from."""

    dm: DecisionModel
    version: ModelVersion
    configmap: Mapping[str, Any]  # the version's rendered ConfigMap: what it holds rolls the pods when it changes
    namespace_labels: Mapping[str, str]  # the namespace's labels: whether a mesh injects sidecars there
    registry_ids: Mapping[str, str] | None = None  # the Model Registry's ids for the version, once registered
    diffusion: bool = False  # a diffusion model (plan/artifacts.py): vLLM gets no seed and no structured outputs
    runtime_image: str | None = None  # the image this version runs (the planner pins it); None: the ServingRuntime's
    storage_key: str | None = None  # the storage-config entry the artifact check read with
    # The plain-Deployment mode's name this KServe accepts (observe/kserve.py): RawDeployment or Standard.
    deployment_mode: str = RAW_DEPLOYMENT


def render_inferenceservice(inputs: PredictorInputs) -> dict[str, Any]:
    """One live version's InferenceService."""
    dm, version, s = inputs.dm, inputs.version, inputs.dm.spec.serving
    name = isvc_name(dm.metadata.name, version.name)
    storage = model_storage(dm, version, inputs.storage_key)
    resources = _resources(dm)
    volumes, mounts = _volumes(dm, version)
    pod_annotations, pod_labels = _pod_metadata(inputs)
    predictor: dict[str, Any] = {
        "minReplicas": s.replicas,
        "maxReplicas": s.replicas,
        "labels": pod_labels,
        "annotations": pod_annotations,
        "tolerations": [t.model_dump(exclude_none=True) for t in s.tolerations],
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        **pod_account(dm),  # the ServiceAccount KServe's storage initializer and the runtime run as
        "volumes": volumes + identity_volumes(dm),
        "model": _model(inputs, name, storage, resources, mounts),
    }
    if s.gpuProduct:
        predictor["nodeSelector"] = {GPU_PRODUCT_LABEL: s.gpuProduct}
    if s.nodes > 1:
        predictor["workerSpec"] = _worker_spec(dm, resources, volumes, mounts)
    annotations = _annotations(dm, version, storage, inputs.deployment_mode) | _registry_annotations(inputs)
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata(dm, name, "inferenceservice", version.name, annotations=annotations)
        | {"labels": _labels(inputs)},
        "spec": {"predictor": predictor},
    }


def _pod_metadata(inputs: PredictorInputs) -> tuple[dict[str, str], dict[str, str]]:
    """The predictor pods' annotations and labels: the mesh's settings, the config checksum, the child labels."""
    dm = inputs.dm
    pod_annotations, pod_labels = sidecar_settings(dm.spec.mesh.sidecar, inputs.namespace_labels)
    # A changed decision.json changes this annotation on the pod template, so the Deployment rolls the pods; files the
    # runtime re-reads live (shadow.json) are left out, so they never restart a pod.
    restart_data = {k: v for k, v in (inputs.configmap.get("data") or {}).items() if k not in LIVE_FILES}
    pod_annotations = {**pod_annotations, ANN_CONFIG_CHECKSUM: checksum(restart_data)}
    pod_labels = {**base_labels(dm, "predictor", inputs.version.name), **pod_labels}
    return pod_annotations, pod_labels


def _labels(inputs: PredictorInputs) -> dict[str, str]:
    """The InferenceService's labels: the child labels, the dashboard's, and the registry's ids once known."""
    dm, registry_ids = inputs.dm, inputs.registry_ids
    labels = {**base_labels(dm, "inferenceservice", inputs.version.name), DASHBOARD: "true"}
    if registry_ids:
        if registry_ids.get("registeredModelId"):
            labels[LABEL_REGISTERED_MODEL_ID] = registry_ids["registeredModelId"]
        if registry_ids.get("modelVersionId"):
            labels[LABEL_MODEL_VERSION_ID] = registry_ids["modelVersionId"]
        reg = dm.spec.registry
        if labels.get(LABEL_MODEL_VERSION_ID) and reg is not None and reg.modelRegistryRef is not None:
            # The registry the dashboard's deployments view shows, and the one odh-model-controller writes its
            # deployment records to: without the namespace it looks in the platform's default registries namespace.
            labels[LABEL_REGISTRY_NAME] = reg.modelRegistryRef.name
            labels[LABEL_REGISTRY_NAMESPACE] = reg.modelRegistryRef.namespace or dm.metadata.namespace
    return labels


def _registry_annotations(inputs: PredictorInputs) -> dict[str, str]:
    """With a registry given by URL, odh-model-controller's deployment records go to that registry: without the
    annotation it would pick the one registry Service of the platform's registries namespace, which may not be the
    registry whose ids the labels carry (docs/registry.md, "Beside odh-model-controller")."""
    reg = inputs.dm.spec.registry
    if reg is None or reg.url is None or not (inputs.registry_ids or {}).get("modelVersionId"):
        return {}
    return {ANN_REGISTRY_URL: reg.url}


def _annotations(dm: DecisionModel, version: ModelVersion, storage: Mapping[str, Any],
                 deployment_mode: str) -> dict[str, str]:
    annotations = {
        # A plain Deployment, under the name this KServe accepts: a name it does not know gets its default mode.
        ANN_DEPLOYMENT_MODE: deployment_mode,
        # Replicas are fixed by spec.serving.replicas: no HPA (GPU pods do not scale on CPU).
        "serving.kserve.io/autoscalerClass": "none",
        "openshift.io/display-name": f"{dm.metadata.name} {version.name}",
        DESCRIPTION: (f"Version {version.name} of the decision model {dm.metadata.name}. Callers use the stable "
                      f"address, which follows promotions: the Route {dm.metadata.name} or "
                      f"{stable_service_url(dm)} in the cluster. The endpoints listed here reach this version alone."),
    }
    if dm.spec.exposure.auth:
        annotations[ENABLE_AUTH] = "true"
    if "storage" in storage:
        # KServe reads the storage-spec credentials from this Secret (its own default is `storage-config`).
        annotations[STORAGE_SECRET_ANNOTATION] = dm.spec.storage.secretName
    return annotations


def _resources(dm: DecisionModel) -> dict[str, Any]:
    s = dm.spec.serving
    gpu = str(s.gpus)
    return {
        "requests": {"cpu": s.resources.cpu, "memory": s.resources.memory, "nvidia.com/gpu": gpu},
        "limits": {"cpu": s.resources.cpu, "memory": s.resources.memory, "nvidia.com/gpu": gpu},
    }


def _volumes(dm: DecisionModel, version: ModelVersion) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: decision.json, /tmp and, for tensor parallel, /dev/shm."""
    volumes: list[dict[str, Any]] = [
        {"name": "decision-config", "configMap": {"name": configmap_name(dm.metadata.name, version.name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "decision-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if dm.spec.serving.gpus > 1:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _model(inputs: PredictorInputs, name: str, storage: Mapping[str, Any], resources: dict[str, Any],
           mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The predictor's model container: vLLM through the Arbiter runtime."""
    dm, runtime_image = inputs.dm, inputs.runtime_image
    return {
        "modelFormat": {"name": MODEL_FORMAT},
        "runtime": runtime_name(dm.metadata.name),
        **storage,
        "args": vllm_args(dm, inputs.version, inputs.diffusion),
        "env": _runtime_env(dm, name, inputs.namespace_labels) + identity_env(dm),
        **({"image": runtime_image} if runtime_image else {}),  # KServe lays it over the ServingRuntime's
        "resources": resources,
        "volumeMounts": mounts + identity_mounts(dm),
        "securityContext": _container_security(),
        **_probes(),
    }


def _runtime_env(dm: DecisionModel, name: str, namespace_labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The runtime's settings: where decision.json is, its port, how it checks who calls it, where its audit goes."""
    auth = dm.spec.exposure.auth
    # Several engines on the pod's GPU: the supervisor starts them one after the other (runtime/supervisor.py).
    engines = dm.spec.serving.vllm.engines
    more = [{"name": "ARBITER_VLLM_ENGINES", "value": str(engines)}] if engines > 1 else []
    return [*_base_env(dm, name, namespace_labels, auth), *more, *audit_env(dm)]


def audit_env(dm: DecisionModel) -> list[dict[str, Any]]:
    """spec.audit.s3 as the runtime reads it (runtime/arbiter_runtime/audit_s3.py): the bucket, the prefix, the lock
    each record object gets, and the credentials from the Secret (never a value in the manifest). Nothing without
    spec.audit.s3: records then go to stdout only."""
    audit = dm.spec.audit
    if audit is None or audit.s3 is None:
        return []
    s3, ret = audit.s3, audit.retention
    env: list[dict[str, Any]] = [{"name": "ARBITER_AUDIT_S3_BUCKET", "value": s3.bucket},
                                 {"name": "ARBITER_AUDIT_S3_PREFIX", "value": s3.prefix}]
    if s3.endpoint:
        env.append({"name": "ARBITER_AUDIT_S3_ENDPOINT", "value": s3.endpoint})
    if s3.region:
        env.append({"name": "ARBITER_AUDIT_S3_REGION", "value": s3.region})
    if ret is not None:
        env += [{"name": "ARBITER_AUDIT_S3_RETENTION_DAYS", "value": str(ret.days)},
                {"name": "ARBITER_AUDIT_S3_LOCK_MODE", "value": ret.mode}]
    env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": s3.secretName, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    return env


def _base_env(dm: DecisionModel, name: str, namespace_labels: Mapping[str, str], auth: bool) -> list[dict[str, Any]]:
    return [
        {"name": "ARBITER_DECISION_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE}"},
        {"name": "ARBITER_PORT", "value": str(SERVING_PORT)},
        {"name": "ARBITER_AUTH", "value": "true" if auth else "false"},
        # What the runtime's SubjectAccessReview asks about: `get` on this InferenceService (runtime/auth.py).
        {"name": "ARBITER_AUTH_NAMESPACE", "value": dm.metadata.namespace},
        {"name": "ARBITER_AUTH_INFERENCESERVICE", "value": name},
        # OpenShift AI's proxy in the pod forwards X-Remote-User from loopback; a mesh sidecar that intercepts
        # the serving port would also arrive from loopback, so then the header is not believed.
        {"name": "ARBITER_AUTH_PROXY_HEADERS",
         "value": "true" if auth and not (
             dm.spec.mesh.sidecar == "none" and namespace_injected(namespace_labels)) else "false"},
    ]


def _worker_spec(dm: DecisionModel, resources: dict[str, Any], volumes: list[dict[str, Any]],
                 mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The pipeline-parallel workers of a multi-node predictor."""
    s = dm.spec.serving
    return {
        "pipelineParallelSize": s.nodes,
        "tensorParallelSize": s.gpus,
        "containers": [
            {
                "name": "worker-container",
                "resources": resources,
                "securityContext": _container_security(),
                "volumeMounts": [m for m in mounts if m["name"] in ("shm", "tmp")],
            }
        ],
        # The worker is its own pod template: it needs its own /dev/shm and /tmp volumes.
        "volumes": [v for v in volumes if v["name"] in ("shm", "tmp")],
    }
