"""Model artifact checks: is what lies at a version's storageUri servable with the serving settings asked for?

The pure part (`check_artifacts`) takes the parsed config.json and the object listing and answers before any GPU is
spent: tensor parallel size against attention and KV heads, pipeline stages against layers, maxModelLen against the
model's position limit, the expected architecture, and whether weight files are there (a safetensors index whose
shards all exist, or single files). It also spots diffusion models (vLLM 0.26 serves
`DiffusionGemmaForBlockDiffusion`), for which the runtime must not ask vLLM for structured outputs or a seed and
validates after generation instead. `listing_digest` fingerprints the listing for status.

`observe/storage.py` reads S3 and calls `check_artifacts`; `artifacts_condition` folds the per-version reports into
the `ArtifactsValid` condition. Pure: no I/O.

Unknown means "will be known after a retry" and holds only versions that have not passed yet (nothing is deployed
for them; the reconcile comes back with a bounded backoff, see plan/recheck.py): S3 unreachable, and every credential
problem (Secret or entry missing, not in storage-config form, access denied). Those are fixed outside the
DecisionModel, often after it was applied, and must not send a promotion into its sticky Failed state the way a real
defect of the artifacts does (False: only a spec change or the retry annotation starts it again).

pvc:// and oci:// cannot be read by the operator (the volume is mounted only into the predictor pod, the image is
pulled by the node). Such a version is reported valid with reason `NotCheckable`, not Unknown: Unknown means "will be
known after a retry", which never happens here, and it would hold the version back forever. vLLM checks those
artifacts at start-up and the version's readiness reports the outcome.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from ..api.conditions import ARTIFACTS_VALID, TOKEN_COST, Condition, make_condition
from ..api.models import effective_decision, effective_vllm
from ..api.names import CONFIG_FILE, LABEL_VERSION
from .model import ArtifactObservation, Observations

# Two reasons of ArtifactsValid come from the quantization and memory check.
from .quantization import GPU_MEMORY_TOO_SMALL as GPU_MEMORY_TOO_SMALL
from .quantization import QUANTIZATION_UNSUPPORTED as QUANTIZATION_UNSUPPORTED
from .quantization import quantization_fit
from .tokencost import TokenCost, TokenizerUnreadable, decision_settings, token_cost


class ObjectInfo(Protocol):
    """One object of a storage listing (clients.s3.ObjectInfo has these)."""

    @property
    def key(self) -> str: ...

    @property
    def etag(self) -> str: ...

    @property
    def size(self) -> int: ...


# Reasons of `ArtifactsValid`.
VALID = "ArtifactsValid"
NOT_CHECKABLE = "NotCheckable"
CONFIG_MISSING = "ConfigMissing"
CONFIG_INVALID = "ConfigInvalid"
TENSOR_PARALLEL_MISMATCH = "TensorParallelMismatch"
PIPELINE_PARALLEL_MISMATCH = "PipelineParallelMismatch"
MAX_MODEL_LEN_TOO_LARGE = "MaxModelLenTooLarge"
ARCHITECTURE_MISMATCH = "ArchitectureMismatch"
WEIGHTS_MISSING = "WeightsMissing"
STORAGE_UNREACHABLE = "StorageUnreachable"
STORAGE_ACCESS_DENIED = "StorageAccessDenied"
STORAGE_CREDENTIALS_INVALID = "StorageCredentialsInvalid"
RECHECKED = "; checked again with backoff, the version is deployed once it passes"

DIFFUSION_ARCHITECTURES = frozenset({"DiffusionGemmaForBlockDiffusion"})
TENSOR_PARALLEL_CHOICES = (1, 2, 4, 8)  # what spec.serving.gpus allows
# Nested configs of multimodal / wrapper models that hold the language model's numbers.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")
# vLLM's keys for the position limit, smallest wins (vllm.config.model._get_and_verify_max_len).
POSITION_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_sequence_length", "max_seq_length", "seq_len",
)

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class ArtifactReport:
    """Outcome for one version. `status` True/False/Unknown as in the condition."""

    status: Status
    reason: str
    message: str
    digest: str | None = None
    diffusion: bool = False
    # Scored mode only, from the version's tokenizer.json (tokencost.py): generated tokens per decision, and the
    # text of the TokenCost condition (None: no tokenizer.json, or not scored).
    tokens_per_decision: int | None = None
    token_cost: Any = None  # tokencost.TokenCost | str (why it could not be counted) | None
    storage_key: str | None = None  # the storage-config entry the check read with (clients.s3.S3Credentials)

    @property
    def deployable(self) -> bool:
        return self.status == "True"


@dataclass(frozen=True)
class ServingAsk:
    """The serving settings the artifacts must fit (from spec.serving)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_model_len: int = 4096
    architecture: str | None = None
    weights_format: str = "safetensors"
    # Quantization and memory (plan/quantization.py): the version's effective vLLM settings and the GPU product.
    dtype: str = "auto"
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    gpu_product: str | None = None
    engines: int = 1  # vLLM engines sharing each GPU: each holds the weights in its share of the memory


# ---------------------------------------------------------------- pure helpers


def parse_storage_uri(uri: str) -> tuple[str, str, str]:
    """`s3://bucket/prefix` -> ("s3", "bucket", "prefix"); other schemes keep their text after the host."""
    scheme, _, rest = uri.partition("://")
    host, _, path = rest.partition("/")
    return scheme, host, path.strip("/")


def listing_digest(listing: Iterable[ObjectInfo]) -> str:
    """sha256 over the sorted (key, etag, size) lines: changes when any file is added, removed or rewritten."""
    h = hashlib.sha256()
    for o in sorted(listing, key=lambda o: o.key):
        h.update(f"{o.key}\t{o.etag}\t{o.size}\n".encode())
    return "sha256:" + h.hexdigest()


def _language_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in TEXT_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping) and "num_attention_heads" in nested:
            return nested
    return config


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _join_choices(values: list[int]) -> str:
    if not values:
        return "none of 1, 2, 4, 8"
    if len(values) == 1:
        return str(values[0])
    return ", ".join(map(str, values[:-1])) + " or " + str(values[-1])


def _tp_fits(tp: int, heads: int, kv_heads: int) -> bool:
    # vLLM: heads % tp == 0; KV heads are split when there are at least tp of them, else replicated (tp % kv == 0).
    if heads % tp:
        return False
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0


def derived_max_len(cfg: Mapping[str, Any]) -> tuple[int | None, str]:
    """The longest context the model supports, the way vLLM derives it, and which key it came from."""
    found = [(cfg[k], k) for k in POSITION_KEYS if _int(cfg, k)]
    if not found:
        return None, ""
    value, key = min(found)
    rope = cfg.get("rope_scaling")
    if isinstance(rope, Mapping):
        rope_type = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if rope_type not in (None, "default", "su", "longrope", "llama3", "mrope") and isinstance(factor, (int, float)):
            if rope_type == "yarn" and _int(rope, "original_max_position_embeddings"):
                value = rope["original_max_position_embeddings"]
            value = int(value * factor)
            key = f"{key} with {rope_type} rope scaling x{factor}"
    return value, key


def is_diffusion(config: Mapping[str, Any]) -> bool:
    archs = set(config.get("architectures") or [])
    lang = _language_config(config)
    return bool(archs & DIFFUSION_ARCHITECTURES) or "canvas_length" in config or "canvas_length" in lang


def _weights_problem(listing: Sequence[ObjectInfo], fmt: str, index: Mapping[str, Any] | None) -> str | None:
    files = {o.key: o for o in listing}
    if fmt == "gguf":
        ggufs = [k for k in files if k.endswith(".gguf") and "/" not in k]
        if not ggufs:
            return "no .gguf file next to config.json; upload the GGUF weights or set spec.model.format: safetensors"
        empty = [k for k in ggufs if files[k].size == 0]
        return f"{empty[0]} is empty (0 bytes); upload it again" if empty else None
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            return "model.safetensors.index.json has no weight_map; upload the index that came with the weights"
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if s not in files]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            return (
                f"{len(missing)} of {len(shards)} weight shards named in model.safetensors.index.json are missing: "
                f"{shown}; upload them"
            )
        empty = [s for s in shards if files[s].size == 0]
        return f"weight shard {empty[0]} is empty (0 bytes); upload it again" if empty else None
    singles = [k for k in files if k.endswith(".safetensors") and "/" not in k]
    if not singles:
        return "no *.safetensors file next to config.json; upload the weights (model.safetensors or shards + index)"
    if len(singles) > 1:
        return (
            f"{len(singles)} safetensors files but no model.safetensors.index.json; upload the index that maps "
            "tensors to shards"
        )
    if files[singles[0]].size == 0:
        return f"{singles[0]} is empty (0 bytes); upload it again"
    return None


def weights_bytes(listing: Sequence[ObjectInfo], fmt: str, index: Mapping[str, Any] | None) -> int:
    """The size of the weight files vLLM loads (after _weights_problem found them all)."""
    files = {o.key: o.size for o in listing}
    if fmt == "gguf":
        return sum(size for key, size in files.items() if key.endswith(".gguf") and "/" not in key)
    if index is not None and isinstance(index.get("weight_map"), Mapping):
        return sum(files.get(shard, 0) for shard in set(map(str, index["weight_map"].values())))
    return sum(size for key, size in files.items() if key.endswith(".safetensors") and "/" not in key)


def check_artifacts(
    config: Mapping[str, Any] | None,
    listing: Sequence[ObjectInfo],
    ask: ServingAsk,
    *,
    where: str,
    index: Mapping[str, Any] | None = None,
    config_error: str | None = None,
) -> ArtifactReport:
    """The whole check, pure. `where` (the storage URI) only goes into messages; `index` is the parsed
    model.safetensors.index.json when the listing has one."""
    digest = listing_digest(listing)
    if config is None:
        if config_error:
            return ArtifactReport("False", CONFIG_INVALID, f"config.json under {where} is not a JSON object "
                                  f"({config_error}); upload the model's config.json", digest=digest)
        return ArtifactReport("False", CONFIG_MISSING, f"no config.json under {where}; upload the model directory "
                              "(config.json and weights) there, or point storageUri at it", digest=digest)
    lang = _language_config(config)
    archs = [str(a) for a in config.get("architectures") or []]
    arch = archs[0] if archs else None
    diffusion = is_diffusion(config)
    problem = _fit_problem(lang, archs, ask)
    if problem is None and (missing := _weights_problem(listing, ask.weights_format, index)):
        problem = WEIGHTS_MISSING, f"{where}: {missing}"
    memory_note = ""
    if problem is None:
        reason, memory_note = quantization_fit(config, lang, weights_bytes(listing, ask.weights_format, index), ask)
        if reason is not None:
            problem = reason, f"{where}: {memory_note}"
    if problem is not None:
        reason, message = problem
        return ArtifactReport("False", reason, message, digest=digest, diffusion=diffusion)
    note = (
        "; diffusion model: no structured outputs and no seed, the runtime validates after generation"
        if diffusion else ""
    )
    return ArtifactReport("True", VALID, f"{where}: {arch or 'model'} fits tensor parallel {ask.tensor_parallel}, "
                          f"maxModelLen {ask.max_model_len}{memory_note}{note}", digest=digest, diffusion=diffusion)


def _fit_problem(lang: Mapping[str, Any], archs: list[str], ask: ServingAsk) -> tuple[str, str] | None:
    """The first way the model's config does not fit the serving settings asked for, as (reason, message); None when
    it fits. Checked in this order: architecture, attention heads, tensor parallel, pipeline stages, maxModelLen."""
    max_pos, pos_key = derived_max_len(lang)
    if ask.architecture and ask.architecture not in archs:
        return ARCHITECTURE_MISMATCH, (f"config.json names architecture {', '.join(archs) or 'none'}, "
                                       f"spec.model.architecture expects {ask.architecture}; fix one of them")
    heads = _int(lang, "num_attention_heads")
    if heads is None:
        return CONFIG_INVALID, ("config.json has no num_attention_heads (nor in text_config); it is not a "
                                "transformer config vLLM can shard")
    kv_heads = _int(lang, "num_key_value_heads") or heads
    tp = ask.tensor_parallel
    if not _tp_fits(tp, heads, kv_heads):
        choices = _join_choices([c for c in TENSOR_PARALLEL_CHOICES if _tp_fits(c, heads, kv_heads)])
        if heads % tp:
            msg = f"tensor parallel {tp} does not divide {heads} attention heads; use {choices}"
        else:
            msg = (f"tensor parallel {tp} does not fit {kv_heads} key/value heads (neither divides the other); "
                   f"use {choices}")
        return TENSOR_PARALLEL_MISMATCH, msg + " (spec.serving.gpus)"
    layers = _int(lang, "num_hidden_layers")
    if layers is not None and ask.pipeline_parallel > layers:
        return PIPELINE_PARALLEL_MISMATCH, (f"pipeline parallel {ask.pipeline_parallel} is more than the {layers} "
                                            f"layers to split; use at most {layers} (spec.serving.nodes)")
    if max_pos is not None and ask.max_model_len > max_pos:
        return MAX_MODEL_LEN_TOO_LARGE, (f"maxModelLen {ask.max_model_len} is larger than the {max_pos} tokens the "
                                         f"model supports ({pos_key}); set spec.serving.vllm.maxModelLen to {max_pos} "
                                         "or less")
    return None


def config_fit(config: Mapping[str, Any], ask: ServingAsk) -> tuple[str, str] | None:
    """(reason, message) when a model's config.json does not fit the serving settings, else None: the check the
    operator makes on storage, for a config.json at hand (`kubectl arbiter lint --model-config`)."""
    return _fit_problem(_language_config(config), [str(a) for a in config.get("architectures") or []], ask)


def not_checkable(uri: str) -> ArtifactReport:
    scheme = parse_storage_uri(uri)[0]
    what = "a PersistentVolumeClaim is mounted only into the predictor pod" if scheme == "pvc" else (
        "an OCI image is pulled by the node, not by the operator")
    return ArtifactReport("True", NOT_CHECKABLE, f"{uri} is not checked before deploying ({what}); vLLM checks it at "
                          "start-up and the version's readiness reports the outcome")


def parse_json_object(raw: bytes | None) -> tuple[Any, str | None]:
    if raw is None:
        return None, None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, str(exc)[:200]
    if not isinstance(value, dict):
        return None, f"top level is {type(value).__name__}"
    return value, None


def count_tokens(tokenizer_raw: bytes | None, decision: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The token fields of an ArtifactReport from the version's tokenizer.json (None: not in the listing)."""
    if tokenizer_raw is None:
        return {"token_cost": f"no tokenizer.json under {where}; generated tokens per decision are not known"}
    try:
        cost = token_cost(tokenizer_raw, **decision)
    except TokenizerUnreadable as exc:
        return {"token_cost": f"tokenizer.json under {where} cannot be read ({exc}); upload the model's tokenizer"}
    return {"tokens_per_decision": cost.per_decision, "token_cost": cost}


def token_cost_condition(reports: Mapping[str, ArtifactReport], generation: int, now: datetime) -> Condition | None:
    """`TokenCost`, a warning that never holds a version back: False when a label or code of a scored version is
    several tokens (with the cost and what to do), Unknown when a tokenizer could not be read, True otherwise.
    None when no version was counted (nothing scored on S3)."""
    counted = {v: r.token_cost for v, r in reports.items() if r.token_cost is not None}
    if not counted:
        return None
    costly = [(v, c) for v, c in counted.items() if isinstance(c, TokenCost) and c.multi_token]
    if costly:
        version, cost = costly[0]
        more = f" ({len(costly) - 1} more version(s) too)" if len(costly) > 1 else ""
        return make_condition(TOKEN_COST, "False", "MultiTokenNames", f"version {version}: {cost.message()}{more}",
                              generation, now)
    unknown = [(v, c) for v, c in counted.items() if isinstance(c, str)]
    if unknown:
        version, why = unknown[0]
        return make_condition(TOKEN_COST, "Unknown", "TokenizerMissing", f"version {version}: {why}", generation, now)
    parts = ", ".join(f"{v}: {c.per_decision}" for v, c in sorted(counted.items()))
    return make_condition(TOKEN_COST, "True", "SingleTokens", f"generated tokens per decision ({parts}); every "
                          "label and reasoning code is one token of the model's tokenizer", generation, now)


def artifacts_condition(reports: Mapping[str, ArtifactReport], generation: int, now: datetime) -> Condition:
    """One `ArtifactsValid` condition for all versions: any False wins, then any Unknown, else True."""
    for status in ("False", "Unknown"):
        bad = [(v, r) for v, r in reports.items() if r.status == status]
        if bad:
            version, report = bad[0]
            more = f" ({len(bad) - 1} more version(s) also fail)" if len(bad) > 1 else ""
            return make_condition(ARTIFACTS_VALID, status, report.reason, f"version {version}: {report.message}{more}",
                                  generation, now)
    unchecked = sorted(v for v, r in reports.items() if r.reason == NOT_CHECKABLE)
    checked = sorted(v for v, r in reports.items() if r.reason != NOT_CHECKABLE)
    if checked:
        msg = f"artifacts of {', '.join(checked)} checked on S3"
        if unchecked:
            msg += f"; {', '.join(unchecked)} on pvc/oci cannot be checked by the operator (vLLM checks at start-up)"
        return make_condition(ARTIFACTS_VALID, "True", VALID, msg, generation, now)
    return make_condition(ARTIFACTS_VALID, "True", NOT_CHECKABLE,
                          f"versions {', '.join(unchecked)} are on pvc/oci and cannot be checked by the operator; vLLM "
                          "checks them at start-up", generation, now)


def serving_ask(spec: Any, version: Any = None) -> ServingAsk:
    """The settings to check from a `DecisionModelSpec` (api.models), with `version`'s own vLLM settings."""
    v = effective_vllm(spec.serving.vllm, getattr(version, "vllm", None))
    return ServingAsk(
        tensor_parallel=spec.serving.gpus,
        pipeline_parallel=spec.serving.nodes,
        max_model_len=v.maxModelLen,
        architecture=spec.model.architecture,
        weights_format=spec.model.format,
        dtype=v.dtype,
        quantization=v.quantization,
        kv_cache_dtype=v.kvCacheDtype,
        gpu_memory_utilization=v.gpuMemoryUtilization,
        engines=v.engines,
        gpu_product=spec.serving.gpuProduct or None,
    )


def decision_to_count(dm: Any, version: Any) -> dict[str, Any] | None:
    """The decision settings whose tokens are counted (tokencost.decision_settings; None: not scored)."""
    return decision_settings(effective_decision(dm.spec.decision, version))


def to_observation(report: ArtifactReport, previous: Any = None, previous_diffusion: bool = False) -> Any:
    """`plan.model.ArtifactObservation` for the planner. When storage cannot be read but the version passed before
    (its status has a digest and is not Invalid), the earlier verdict stands, diffusion flag included (it shapes the
    vLLM args and the runtime's config): an S3 outage or a broken Secret must not change a serving version."""
    if report.status == "Unknown" and previous is not None and previous.artifactsDigest and previous.phase != "Invalid":
        return ArtifactObservation(valid=True, reason=report.reason, message=report.message,
                                   digest=previous.artifactsDigest, diffusion=previous_diffusion,
                                   tokens_per_decision=previous.tokensPerDecision)
    valid = {"True": True, "False": False}.get(report.status)
    return ArtifactObservation(valid=valid, reason=report.reason, message=report.message, digest=report.digest,
                               diffusion=report.diffusion, tokens_per_decision=report.tokens_per_decision,
                               storage_key=report.storage_key)


def deployed_as_diffusion(obs: Observations, version: str) -> bool:
    """Whether the version's deployed decision config (its ConfigMap, render.configmap) says diffusion."""
    for cm in obs.of_kind("ConfigMap").values():
        if ((cm.get("metadata") or {}).get("labels") or {}).get(LABEL_VERSION) != version:
            continue
        try:
            return json.loads((cm.get("data") or {}).get(CONFIG_FILE) or "{}").get("diffusion") is True
        except (ValueError, AttributeError):
            return False
    return False
