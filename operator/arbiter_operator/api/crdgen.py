"""Generate crds/arbiter.dev_decisionmodels.yaml from the pydantic models.

    python -m arbiter_operator.api.crdgen           # write the file
    python -m arbiter_operator.api.crdgen --check   # exit 1 when the file differs from the models

pydantic emits JSON Schema 2020-12; the apiserver wants a *structural* OpenAPI v3 schema: every node typed, no
$ref/anyOf-with-null/const/title, `exclusiveMinimum` as a boolean, free-form objects marked
`x-kubernetes-preserve-unknown-fields`, defaults that are themselves valid. This module does that translation.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import models, names
from .models import EXTRA_VALIDATIONS, DecisionModelSpec, DecisionModelStatus

CRD_FILE = Path(__file__).resolve().parents[3] / "crds" / f"{names.GROUP}_{names.PLURAL}.yaml"

_DROP = {"title", "$defs", "$schema"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and translate each node to structural OpenAPI v3."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)  # description/default on the referencing field win
        return _resolve(target, defs)
    node = dict(node)
    if "anyOf" in node:
        # Optional[X] -> X. Null values are pruned by the apiserver for non-nullable fields, which is what we want.
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unsupported union in schema: {options}")
        inner = options[0]
        if node.get("default", "absent") is None:
            node.pop("default")
        merged = dict(inner)
        merged.update(node)
        node = merged
        return _resolve(node, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        merged = dict(inner)
        merged.update(node)
        return _resolve(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
        elif key in ("items",):
            out[key] = _resolve(value, defs)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is False:
                continue  # structural schemas prune unknown fields anyway
            else:
                out[key] = _resolve(value, defs)
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        sample = out["enum"][0]
        out["type"] = "integer" if isinstance(sample, int) else "string"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _attach_extra_validations(schema: dict[str, Any]) -> None:
    """Attach EXTRA_VALIDATIONS to every place a class from another module appears (matched by its properties)."""
    for cls, rules in EXTRA_VALIDATIONS.items():
        names = {field.alias or name for name, field in cls.model_fields.items()}

        def walk(node: Any, names: set[str] = names, rules: Any = rules) -> None:
            if isinstance(node, dict):
                props = node.get("properties")
                if isinstance(props, dict) and set(props) == names:
                    node.setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(schema)


def _fill_factory_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """pydantic leaves default_factory out of JSON Schema; the CRD needs them so the apiserver defaults them."""
    props = schema.get("properties", {})
    for name, field in model.model_fields.items():
        key = field.alias or name
        sub = props.get(key)
        if sub is None:
            continue
        ann = field.annotation
        nested = _model_of(ann)
        if field.default_factory is not None and "default" not in sub:
            value = field.default_factory()  # type: ignore[call-arg]  # (factories here take no data)
            if isinstance(value, BaseModel):
                # `{}` lets the nested defaults apply and stays readable; valid because the class has none required.
                sub["default"] = {}
            else:
                sub["default"] = _dump(value)
        if nested is not None:
            target = sub["items"] if sub.get("type") == "array" else sub
            _fill_factory_defaults(target, nested)


def _model_of(ann: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _object_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _resolve(raw, defs)
    _fill_factory_defaults(schema, model)
    _attach_extra_validations(schema)
    return schema


def _strip_defaults(node: Any) -> Any:
    """Status is written whole by the operator: apiserver defaults there would only invent values."""
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_strip_defaults(v) for v in node]
    return node


def name_rules() -> list[dict[str, str]]:
    """Rules on metadata.name: every name the operator and KServe derive from it must be valid (see child_names.py)."""
    m = models
    return [
        {
            "rule": f"self.metadata.name.matches('{m.ISVC_NAME_PATTERN}')",
            "message": "metadata.name must start with a letter and hold only lowercase letters, digits and '-' "
            f"(no dots): it begins every InferenceService name, and KServe requires {m.ISVC_NAME_PATTERN[1:-1]}",
        },
        {
            "rule": f"!self.metadata.name.contains('{m.NAME_SEPARATOR}')",
            "message": f"metadata.name must not contain '{m.NAME_SEPARATOR}': child names are "
            f"<name>{m.NAME_SEPARATOR}<version>, and '{m.NAME_SEPARATOR}' is what keeps two DecisionModels' "
            "children apart",
        },
        {
            "rule": f"self.spec.versions.all(v, size(self.metadata.name) + size(v.name) <= {m.MAX_NAME_PLUS_VERSION})",
            "message": f"metadata.name plus each version name must be at most {m.MAX_NAME_PLUS_VERSION} characters: "
            f"the InferenceService is <name>{m.NAME_SEPARATOR}<version> and KServe labels its pods "
            f"app=isvc.<InferenceService>-predictor, a label value of at most {m.LABEL_VALUE_MAX} characters; "
            f"in a namespace longer than {m.NAME_PLUS_VERSION_BEFORE_NAMESPACE - m.MAX_NAME_PLUS_VERSION} characters "
            f"the limit is lower, {m.NAME_PLUS_VERSION_BEFORE_NAMESPACE} less the namespace's length (KServe's host "
            "label <InferenceService>-predictor-<namespace>), which this schema cannot see: the chart's admission "
            "policy and the operator (InvalidSpec) refuse that",
        },
        {
            "rule": f"self.spec.serving.nodes == 1 || self.spec.versions.all(v, size(self.metadata.name) + "
            f"size(v.name) <= {m.MAX_NAME_PLUS_VERSION_MULTINODE})",
            "message": f"with spec.serving.nodes > 1, metadata.name plus each version name must be at most "
            f"{m.MAX_NAME_PLUS_VERSION_MULTINODE} characters: KServe labels the workers "
            f"app=isvc.<InferenceService>-predictor-worker, a label value of at most {m.LABEL_VALUE_MAX} characters",
        },
    ]


def openapi_schema() -> dict[str, Any]:
    spec = _object_schema(DecisionModelSpec)
    status = _strip_defaults(_object_schema(DecisionModelStatus))
    # promote.version is compared in CEL rules; a bound keeps their estimated cost low (same bound as version names).
    spec["properties"]["promote"]["properties"]["version"]["maxLength"] = 40
    status["description"] = "Observed state, written only by the operator."
    spec["description"] = "Desired state of a decision model: its versions, which one to promote, how to serve it."
    return {
        "type": "object",
        "description": "A decision model served on vLLM through KServe, with versions, promotion and governance.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": name_rules(),
    }


def crd() -> dict[str, Any]:
    ready = '.status.conditions[?(@.type=="Ready")]'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{names.PLURAL}.{names.GROUP}",
            "annotations": {"arbiter.dev/generated-by": "python -m arbiter_operator.api.crdgen"},
        },
        "spec": {
            "group": names.GROUP,
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
                "categories": ["arbiter"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Active", "type": "string", "jsonPath": ".status.activeVersion"},
                        {"name": "Candidate", "type": "string", "jsonPath": ".status.promotion.candidate"},
                        {"name": "Ready", "type": "string", "jsonPath": f"{ready}.status"},
                        {"name": "Reason", "type": "string", "jsonPath": f"{ready}.reason"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 1},
                    ],
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = (
    "# Generated by `python -m arbiter_operator.api.crdgen` from operator/arbiter_operator/api/models.py.\n"
    "# Do not edit.\n"
)


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the CRD file differs from the models")
    parser.add_argument("--output", type=Path, default=CRD_FILE)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), str(args.output), "generated from models"
                )
            )
            print(f"\n{args.output} is out of date: run python -m arbiter_operator.api.crdgen", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
