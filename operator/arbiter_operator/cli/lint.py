"""`kubectl arbiter lint FILE...`: a DecisionModel manifest checked offline, before a commit, by the rules that judge
it at `oc apply`, in their order: the apiserver's (strict decoding, the CRD's schema and CEL rules: crdcheck.py, with
the apiserver's messages), then the operator's admission webhook's (the API's pydantic validation and
`plan.validate.spec_problems`: vLLM flags in every spelling, schemas, output-schema satisfiability, fallback rules'
CEL, name and host limits for the namespace), and, with `--model-config`, the artifact check of tensor parallel,
pipeline stages and maxModelLen against the model's config.json. Other kinds in the files are skipped (a directory of
Argo CD manifests lints as it is). Exit 0: every DecisionModel passes; EXIT_PROBLEMS: some do not; EXIT_USAGE: a
file cannot be read or parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from ..api.models import DecisionModel
from ..api.names import API_VERSION, GROUP, KIND
from ..plan.artifacts import config_fit, serving_ask
from ..plan.validate import spec_problems
from .cluster import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, CliError
from .crdcheck import check

DEFAULT_NAMESPACE = "default"


@dataclass
class Finding:
    """What lint says of one DecisionModel document."""

    source: str  # FILE, FILE#2 (the second document), -
    name: str
    apiserver: list[str] = field(default_factory=list)  # what `oc apply` would answer
    operator: list[str] = field(default_factory=list)  # what the admission webhook (and the status) would say
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.apiserver or self.operator)


def documents(text: str, source: str) -> list[tuple[str, Any]]:
    """(label, document) for each YAML (or JSON) document; a parse error names the file and the line."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise CliError(f"{source}:{line} is not valid YAML: {getattr(exc, 'problem', exc)}", EXIT_USAGE) from None
    out: list[tuple[str, Any]] = []
    for i, doc in enumerate(docs):
        label = source if len(docs) == 1 else f"{source}#{i + 1}"
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out += [(f"{label} items[{j}]", item) for j, item in enumerate(doc["items"])]
        else:
            out.append((label, doc))
    return out


def lint_one(doc: dict[str, Any], source: str, namespace: str | None,
             model_config: dict[str, Any] | None = None) -> Finding:
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    finding = Finding(source, str(meta.get("name") or "<no name>"))
    if doc.get("apiVersion") != API_VERSION:
        finding.apiserver.append(f"apiVersion {doc.get('apiVersion')!r} is not served for {KIND}: use {API_VERSION}")
        return finding
    errors, unknown, defaulted = check(doc)
    finding.apiserver += [f'unknown field "{u}"' for u in unknown]
    finding.apiserver += [str(e) for e in errors]
    if finding.apiserver:
        return finding  # the apiserver refuses it before the webhook is asked
    ns = meta.get("namespace") or namespace
    if not ns:
        ns = DEFAULT_NAMESPACE
        finding.notes.append(f"no namespace in the manifest or -n: name and host limits checked for namespace {ns!r}")
    defaulted.setdefault("metadata", {})["namespace"] = ns
    try:
        dm = DecisionModel.model_validate(defaulted)
    except ValidationError as exc:
        finding.operator += [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()]
        return finding
    finding.operator += spec_problems(dm)
    if model_config is not None:
        fit = config_fit(model_config, serving_ask(dm.spec))
        if fit is not None:
            finding.operator.append(f"{fit[0]}: {fit[1]}")
    return finding


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_USAGE) from None


def lint_files(paths: list[str], namespace: str | None, model_config: dict[str, Any] | None) -> list[Finding]:
    findings: list[Finding] = []
    for path in paths:
        for label, doc in documents(_read(path), path):
            if not isinstance(doc, dict):
                findings.append(Finding(label, "<not an object>", apiserver=["the document is not a YAML mapping"]))
            elif doc.get("kind") == KIND or str(doc.get("apiVersion", "")).startswith(f"{GROUP}/"):
                findings.append(lint_one(doc, label, namespace, model_config))
    return findings


def run(args: argparse.Namespace, out: TextIO) -> int:
    model_config = None
    if args.model_config:
        try:
            model_config = json.loads(_read(args.model_config))
        except ValueError as exc:
            raise CliError(f"{args.model_config} is not JSON: {exc}", EXIT_USAGE) from None
        if not isinstance(model_config, dict):
            raise CliError(f"{args.model_config} is not a JSON object (a model's config.json)", EXIT_USAGE)
    namespace = args.lint_namespace or getattr(args, "g_namespace", None)
    findings = lint_files(args.files, namespace, model_config)
    if args.output == "json":
        print(json.dumps([f.__dict__ for f in findings], indent=2), file=out)
    else:
        for f in findings:
            head = f"{f.source}: {KIND} {f.name}"
            if f.ok:
                print(f"{head}: ok", file=out)
            for problem in f.apiserver:
                print(f"{head}: the apiserver refuses it: {problem}", file=out)
            for problem in f.operator:
                print(f"{head}: the operator refuses it: {problem}", file=out)
            for note in f.notes:
                print(f"{head}: note: {note}", file=out)
        if not findings:
            print(f"no {KIND} found in {', '.join(args.files)}", file=out)
    return EXIT_OK if all(f.ok for f in findings) else EXIT_PROBLEMS
