"""Checks the apiserver cannot make (CEL in CEL, JSON Schema validity): each problem says what to fix."""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from typing import Any

import jsonschema
from arbiter_runtime.contract import DecisionJsonError, scored_names_problem

from ..api.models import (
    HOST_LABEL_SUFFIX,
    LABEL_VALUE_MAX,
    MAX_NAME_PLUS_VERSION,
    NAME_PLUS_VERSION_BEFORE_NAMESPACE,
    DecisionModel,
    DecisionModelSpec,
    effective_decision,
    isvc_name,
    name_plus_version_limit,
    version_slug,
)
from ..render.common import CONFIG_FILE
from ..render.configmap import decision_config, readable_json
from .output_schema import output_schema_clash
from .quantization import quantization_problems
from .vllm_args import arg_problems


@functools.cache
def _cel_environment() -> Any:
    """One CEL environment for the process: building one builds its Lark parser (about 0.1 s of CPU)."""
    import celpy  # cel-python: the same CEL dialect the runtime evaluates fallback rules with

    return celpy.Environment()


def warm_up() -> None:
    """Build what the first check would build (the CEL parser), so the first reconciles do not wait for it."""
    _cel_environment()


def _cel_problem(expr: str) -> str | None:
    try:
        _cel_environment().compile(expr)
    except Exception as exc:  # celpy raises its own CELParseError; keep the first line, it names the position
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _scored_format_problems(version: str, decision: Any) -> list[str]:
    """What the runtime's scored format refuses about these names (the decision.json contract's own check: a name
    that starts another where nothing separates them, more fused pairs than vLLM returns), said before deploying."""
    problem = scored_names_problem(decision.scoredFormat, decision.labels, decision.reasoningCodes)
    return [f"decision (version {version}): {problem}"] if problem else []


def spec_problems(dm: DecisionModel) -> list[str]:
    """Everything the operator refuses a DecisionModel for beyond its API's own validation: the one list the plan
    (InvalidSpec) and the admission webhook (a refused `oc apply`) both judge by."""
    return operator_side_problems(dm.spec) + size_problems(dm)


def operator_side_problems(spec: DecisionModelSpec) -> list[str]:
    """The problems of one spec, remembered by the digest of the parts the checks read (_CHECKED): every pass of a
    DecisionModel plans from the same spec until it changes, and many DecisionModels share their decision settings;
    checking the schemas and compiling the CEL again each time cost about 7% of the operator's CPU at scale. The
    checks are pure, so a remembered answer is the answer."""
    digest = hashlib.sha256(spec.model_dump_json(include=_CHECKED).encode()).digest()
    found = _PROBLEMS.get(digest)
    if found is None:
        found = _PROBLEMS[digest] = tuple(_check(spec))
        if len(_PROBLEMS) > _PROBLEMS_HELD:
            _PROBLEMS.popitem(last=False)
    else:
        _PROBLEMS.move_to_end(digest)
    return list(found)


# What `_check` reads of a spec, and so what its remembered answer is keyed by: a fleet of DecisionModels that differ
# only in their weights (storageUri), names or serving resources is checked once, not once per DecisionModel.
_CHECKED: Any = {"decision": True, "versions": {"__all__": {"name", "metadata", "decision", "vllm"}},
                 "serving": {"vllm": {"extraArgs", "quantization", "kvCacheDtype", "dtype"}, "gpuProduct": True}}
_PROBLEMS: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()  # checked parts' digest -> problems, least recent first
_PROBLEMS_HELD = 4096


def _check(spec: DecisionModelSpec) -> list[str]:
    problems: list[str] = []
    for version in spec.versions:
        for key in ("inputSchema", "outputSchema"):
            schema = getattr(version.metadata, key)
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
                problems.append(
                    f"spec.versions[{version.name}].metadata.{key} is not a valid JSON Schema at {where}: {exc.message}"
                )
        decision = effective_decision(spec.decision, version)
        if not any(p.startswith(f"spec.versions[{version.name}].metadata.outputSchema") for p in problems):
            clash = output_schema_clash(version.metadata.outputSchema, decision)
            if clash:
                problems.append(f"spec.versions[{version.name}].metadata.outputSchema {clash}")
        if decision.trajectoryMode == "scored":
            problems.extend(_scored_format_problems(version.name, decision))
        for rule in decision.fallbackRules:
            err = _cel_problem(rule.when)
            if err:
                problems.append(
                    f"fallback rule {rule.name!r} (version {version.name}): `when` is not valid CEL: {err}"
                )
    problems.extend(arg_problems(spec.serving.vllm.extraArgs))
    problems.extend(quantization_problems(spec))
    # Report each problem once even when several versions share spec.decision.
    return list(dict.fromkeys(problems))


# A ConfigMap's data may hold at most 1 MiB (keys plus values); decision.json is rendered into one per live version.
CONFIGMAP_MAX_BYTES = 1024 * 1024


def size_problems(dm: DecisionModel) -> list[str]:
    """What depends on the namespace or on rendered output, beyond the CRD's reach: the router's default host, and
    versions whose decision.json the runtime would refuse or that cannot fit the ConfigMap that carries it."""
    problems = []
    name, ns = dm.metadata.name, dm.metadata.namespace
    if not dm.spec.exposure.host and len(name) + 1 + len(ns) > 63:
        problems.append(
            f"the router's default host for Route {name} begins with {name}-{ns}, {len(name) + 1 + len(ns)} "
            "characters, and a DNS label holds at most 63: set spec.exposure.host, or use a shorter name"
        )
    problems.extend(host_label_problems(dm))
    for version in dm.spec.versions:
        try:
            config = decision_config(dm, version)
        except DecisionJsonError as exc:  # what the CRD's rules cannot see, e.g. across a version's overrides
            problems.append(f"spec.versions[{version.name}]: the runtime would refuse its decision.json: {exc}")
            continue
        # The very text the ConfigMap will hold (made once per content, so rendering it next costs nothing).
        size = len(readable_json(config).encode()) + len(CONFIG_FILE)
        if size > CONFIGMAP_MAX_BYTES:
            problems.append(
                f"spec.versions[{version.name}]: its decision.json (schemas and decision settings) would be {size} "
                f"bytes, and the ConfigMap that carries it holds at most {CONFIGMAP_MAX_BYTES}: shrink its "
                "inputSchema/outputSchema"
            )
    return problems


def host_label_problems(dm: DecisionModel) -> list[str]:
    """Versions whose predictor host label KServe would refuse in this namespace (the CRD cannot see the namespace)."""
    name, ns = dm.metadata.name, dm.metadata.namespace
    limit = name_plus_version_limit(ns)
    out = []
    for version in dm.spec.versions:
        if len(name) + len(version_slug(version.name)) > limit:
            host = f"{isvc_name(name, version.name)}{HOST_LABEL_SUFFIX}{ns}"
            out.append(
                f"spec.versions[{version.name}]: KServe names its predictor's host {host}, {len(host)} characters, "
                f"and a DNS label holds at most {LABEL_VALUE_MAX}: in namespace {ns} the DecisionModel's name plus a "
                f"version's name may be at most {limit} characters ({NAME_PLUS_VERSION_BEFORE_NAMESPACE} less the "
                f"namespace's {len(ns)}; the CRD admits {MAX_NAME_PLUS_VERSION} because it cannot see the namespace): "
                "use a shorter name or version"
            )
    return out
