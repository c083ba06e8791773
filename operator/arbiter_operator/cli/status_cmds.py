"""The read-only commands: `status` (once, `--watch`, `--timeout`), `history` and `list`, as text, JSON or YAML.

`status --timeout` is for pipelines: it waits on a watch (no polling) until the promotion the spec asks for is done
(exit 0), fails (EXIT_DEGRADED: rolled back, aborted, Stalled) or the time runs out (EXIT_TIMEOUT). What counts as
done is `settled()`, a pure function of the object, so the rule is unit-tested and the same for `--watch`.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from ..api.names import PLURAL
from .cluster import EXIT_DEGRADED, EXIT_NOT_FOUND, EXIT_OK, EXIT_TIMEOUT, CliError, Cluster
from .printing import condition_status, one_line, print_history, print_list, print_status, summary

# Phases after which the promotion the spec asks for holds all traffic.
_DONE_PHASES = ("Idle", "Cooling")


def settled(obj: dict[str, Any]) -> tuple[int | None, str]:
    """(exit code, why) once the DecisionModel has reached an end the spec asked for, or (None, what it waits for).

    Done (0): the operator has seen this generation, Ready is True and the version spec.promote names is stable with
    no promotion running. Failed (EXIT_DEGRADED): Stalled is True (rolled back, failed, invalid spec, unknown
    version) or the promotion was aborted. Anything else is still moving."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    promo = status.get("promotion") or {}
    wanted = (spec.get("promote") or {}).get("version")
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if isinstance(generation, int) and (not isinstance(observed, int) or observed < generation):
        return None, f"the operator has not processed generation {generation} yet"
    stalled, stalled_reason = condition_status(obj, "Stalled")
    if stalled == "True":
        found = [c for c in status.get("conditions") or [] if c.get("type") == "Stalled"]
        message = str(found[0].get("message") or "") if found else ""
        return EXIT_DEGRADED, f"Stalled: {stalled_reason}: {message}".strip().rstrip(":")
    phase = promo.get("phase") or "Idle"
    if phase == "Aborted":
        return EXIT_DEGRADED, f"the promotion of {promo.get('candidate')} was aborted; {promo.get('stable')} serves"
    ready, reason = condition_status(obj, "Ready")
    if ready == "True" and phase in _DONE_PHASES and promo.get("stable") == wanted:
        return EXIT_OK, f"{wanted} is promoted and Ready"
    return None, f"waiting: phase {phase}, Ready={ready}" + (f" ({reason})" if reason else "")


def _dump(value: Any, output: str, out: TextIO) -> None:
    if output == "yaml":
        yaml.safe_dump(value, out, sort_keys=False, width=120)
    else:
        print(json.dumps(value, indent=2), file=out)


def _status_text(obj: dict[str, Any], output: str) -> str:
    buf = io.StringIO()
    if output == "text":
        print_status(obj, buf)
    else:
        _dump(obj.get("status") or {}, output, buf)
    return buf.getvalue()


def cmd_status(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    if args.watch or args.timeout is not None:
        return _follow(cluster, args, out)
    out.write(_status_text(cluster.get(args.name), args.output))
    return EXIT_OK


def _follow(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    """--watch: redraw on every change; --timeout: wait for settled(); both: redraw until settled or time is up."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    tty = args.watch and hasattr(out, "isatty") and out.isatty()
    last_shown = ""
    obj = cluster.get(args.name)
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    try:
        while True:
            shown = _status_text(obj, args.output) if args.watch else one_line(obj) + "\n"
            if shown != last_shown:
                if tty:
                    out.write("\033[H\033[2J")  # clear the screen and redraw, as `watch` does
                elif args.watch and last_shown:
                    out.write(f"--- {datetime.now(UTC).strftime('%H:%M:%S')}\n")
                if not args.watch:
                    out.write(f"{datetime.now(UTC).strftime('%H:%M:%S')} ")
                out.write(shown)
                out.flush()
                last_shown = shown
            if deadline is not None:
                code, why = settled(obj)
                if code is not None:
                    print(why, file=out if code == EXIT_OK else sys.stderr)
                    return code
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                print(f"timed out after {args.timeout:g}s: {settled(obj)[1]}", file=sys.stderr)
                return EXIT_TIMEOUT
            obj, version = _next_change(cluster, args.name, version, obj, remaining)
    except KeyboardInterrupt:
        return EXIT_OK


def _next_change(cluster: Cluster, name: str, version: str, obj: dict[str, Any],
                 remaining: float | None) -> tuple[dict[str, Any], str]:
    """The object after its next change, or as it is when the wait (at most `remaining` s) ends without one."""
    seconds = max(1, min(300, int(remaining + 0.999))) if remaining is not None else 300
    try:
        for kind, new in cluster.watch(name, resource_version=version, seconds=seconds):
            if kind == "DELETED":
                raise CliError(f"decisionmodel {cluster.namespace}/{name} was deleted", EXIT_NOT_FOUND)
            return new, str(new["metadata"].get("resourceVersion") or version)
    except CliError as exc:
        if "410" not in str(exc) and "too old" not in str(exc) and "Expired" not in str(exc):
            raise
    # The watch ended (its time, or a resourceVersion too old): read the object again.
    fresh = cluster.get(name)
    return fresh, str(fresh["metadata"].get("resourceVersion") or "")


def cmd_history(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    obj = cluster.get(args.name)
    if args.output == "text":
        print_history(obj, out)
    else:
        _dump(((obj.get("status") or {}).get("promotion") or {}).get("history") or [], args.output, out)
    return EXIT_OK


def cmd_list(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    objs, _ = cluster.list_models(all_namespaces=args.all_namespaces)
    objs.sort(key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
    if args.output == "text":
        print_list(objs, out, args.all_namespaces)
    else:
        _dump({"kind": "List", "resource": PLURAL, "items": [summary(o) for o in objs]}, args.output, out)
    return EXIT_OK
