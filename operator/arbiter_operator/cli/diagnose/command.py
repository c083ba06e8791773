"""`kubectl arbiter diagnose NAME`: gather (gather.py), judge (rules.py), print: the ranked verdict, each with its
evidence and fix, the recent Events, and what could not be read. Exit 0 when nothing is wrong in what was read,
EXIT_PROBLEMS when a problem was found."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from importlib import resources
from typing import Any, TextIO

import yaml

from ..cluster import EXIT_OK, EXIT_PROBLEMS, Cluster
from .gather import gather
from .rules import PROBLEM_SCORE, Diagnosis, diagnose


@functools.cache
def reason_table() -> list[dict[str, str]]:
    """The operator's reason tables (docs/operations.md, copied by `python -m arbiter_devenv.reason_table`)."""
    text = resources.files("arbiter_operator.cli.diagnose").joinpath("reasons.json").read_text()
    rows = json.loads(text).get("rows")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def print_text(d: Diagnosis, out: TextIO) -> None:
    problems = d.problems
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}" if problems else "no problem found"
    print(f"DecisionModel {d.namespace}/{d.name}: {head}", file=out)
    for i, f in enumerate(d.findings, 1):
        tag = "" if f.score >= PROBLEM_SCORE else " (note)"
        print(f"\n{i}. [{f.code}]{tag} {f.verdict}", file=out)
        for line in f.evidence:
            print(f"   evidence: {line}", file=out)
        for line in f.fix:
            print(f"   fix: {line}", file=out)
    if d.events:
        print("\nRecent Events:", file=out)
        for line in d.events:
            print(f"  {line}", file=out)
    print(f"\nRead: {', '.join(d.read) or 'nothing'}", file=out)
    if d.unreadable:
        print("Could not read:", file=out)
        for line in d.unreadable:
            print(f"  - {' '.join(line.split())}", file=out)


def as_dict(d: Diagnosis) -> dict[str, Any]:
    return {"namespace": d.namespace, "name": d.name, "problems": len(d.problems),
            "findings": [dataclasses.asdict(f) for f in d.findings], "events": d.events, "read": d.read,
            "unreadable": d.unreadable}


def run(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    evidence = gather(cluster, args.name, list(args.metrics_url or []), args.prometheus, args.window,
                      args.metrics_token)
    result = diagnose(evidence, reason_table())
    if args.output == "json":
        print(json.dumps(as_dict(result), indent=2), file=out)
    elif args.output == "yaml":
        yaml.safe_dump(as_dict(result), out, sort_keys=False, width=120)
    else:
        print_text(result, out)
    return EXIT_PROBLEMS if result.problems else EXIT_OK
