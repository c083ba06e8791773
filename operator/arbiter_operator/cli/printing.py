"""What `kubectl arbiter status` and `history` print: a DecisionModel's promotion, analysis and conditions, and its
promotion history, as plain text from the object as read (any field may be missing: it prints what is there)."""

from __future__ import annotations

from typing import Any, TextIO


def _cond(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conds = (obj.get("status") or {}).get("conditions")
    return next((c for c in conds if isinstance(c, dict) and c.get("type") == type_), None) \
        if isinstance(conds, list) else None


def _traffic(obj: dict[str, Any]) -> str:
    serving = _cond(obj, "Serving")
    if serving and serving.get("status") == "True":
        return str(serving.get("message") or "").removeprefix("Serving ")
    promo = (obj.get("status") or {}).get("promotion") or {}
    if not promo.get("stable"):
        return "none"
    w = promo.get("weight", 0)
    if promo.get("phase") == "Progressing" and 0 < w < 100:
        return f"{promo['stable']} {100 - w}%, {promo.get('candidate')} {w}%"
    return f"{promo['stable']} 100%"


def print_status(obj: dict[str, Any], out: TextIO) -> None:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    promo = status.get("promotion") or {}
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    print(f"Name:        {meta['namespace']}/{meta['name']}", file=out)
    print(f"Wanted:      {(spec.get('promote') or {}).get('version')} "
          f"({(spec.get('promote') or {}).get('strategy', 'Immediate')})", file=out)
    print(f"Phase:       {promo.get('phase', 'Idle')}", file=out)
    print(f"Stable:      {promo.get('stable') or '-'}", file=out)
    if promo.get("candidate"):
        line = promo["candidate"]
        if promo.get("phase") in ("Progressing", "Paused") and promo.get("weight"):
            n = len((spec.get("promote") or {}).get("steps") or [])
            line += f" (step {promo.get('step', 0) + 1}/{n}, {promo.get('weight', 0)}%)"
        elif promo.get("phase") == "Shadowing":
            line += " (shadow: mirrored requests only, no live traffic)"
        print(f"Candidate:   {line}", file=out)
    if promo.get("previous"):
        print(f"Previous:    {promo['previous']} (warm until {promo.get('coolingUntil')})", file=out)
    print(f"Traffic:     {_traffic(obj)}", file=out)
    if gen is not None and observed is not None and observed < gen:
        print(f"Note:        the operator has not processed generation {gen} yet (status is for {observed})", file=out)
    last = promo.get("lastAnalysis")
    if last:
        print(f"Analysis:    {last.get('verdict')} at {last.get('at')}: {last.get('message', '')}", file=out)
        checks = last.get("checks") or []
        if checks:
            print(f"  {'CHECK':<24}{'VALUE':>12}{'BOUND':>14}  VERDICT", file=out)
            for c in checks:
                word = "<=" if c.get("direction", "max") == "max" else ">="
                bound = "-" if c.get("bound") is None else f"{word} {_num(c.get('bound'))}"
                print(f"  {c.get('name', '')!s:<24}{_num(c.get('value')):>12}{bound:>14}  {c.get('verdict', '')}",
                      file=out)
            _print_evidence(checks, out)
    if promo.get("failureReason"):
        print(f"Failure:     {promo['failureReason']}: {promo.get('failureMessage', '')}", file=out)
    print("Conditions:", file=out)
    for c in status.get("conditions") or []:
        print(f"  {c['type']:<15} {c['status']:<8} {c.get('reason', ''):<26} {c.get('message', '')}", file=out)
    if promo.get("phase") == "Paused":
        print(f"\nWaiting for approval: kubectl arbiter approve {meta['name']} -n {meta['namespace']}  "
              f"(or kubectl arbiter abort)", file=out)
    if promo.get("phase") == "Failed":
        print(f"\nTo try again: kubectl arbiter retry {meta['name']} -n {meta['namespace']}  (or change the spec)",
              file=out)


def _print_evidence(checks: list[Any], out: TextIO) -> None:
    """Sequential mode: each gate's statistic (candidate minus stable, in points, with its always-valid interval),
    the regression it tolerates, the evidence so far and needed, and when a verdict should come."""
    rows = [c for c in checks if isinstance(c, dict) and isinstance(c.get("evidence"), dict)]
    if not rows:
        return
    print(f"  {'EVIDENCE':<24}{'STATISTIC':>30}{'TOLERATED':>11}{'DECISIONS':>11}{'NEEDED':>10}  VERDICT IN",
          file=out)
    for c in rows:
        ev = c["evidence"]
        stat = f"{_pts(ev.get('estimate'))} [{_pts(ev.get('lower'))}, {_pts(ev.get('upper'))}]"
        needed, eta = ev.get("decisionsNeeded"), ev.get("secondsToVerdict")
        when = "now" if c.get("verdict") in ("Pass", "Fail") else (
            "not expected" if needed is None else "unknown" if not isinstance(eta, (int, float)) else f"~{eta:.0f}s")
        print(f"  {c.get('name', '')!s:<24}{stat:>30}{_pts(ev.get('tolerated')):>11}"
              f"{_count(ev.get('decisions')):>11}{_count(needed):>10}  {when}", file=out)
    print("  (statistic and tolerated regression in percentage points of decisions; interval valid at every look)",
          file=out)


def _pts(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    return f"{value * 100:+.2f}"


def _count(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:,.0f}"


def _num(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)[:12]
    return f"{value:.4g}"


def print_history(obj: dict[str, Any], out: TextIO) -> None:
    history = ((obj.get("status") or {}).get("promotion") or {}).get("history") or []
    if not history:
        print("No promotions recorded.", file=out)
        return
    print(f"{'FINISHED':<22}{'VERSION':<14}{'FROM':<14}{'OUTCOME':<12}{'DURATION':>10}  REASON", file=out)
    for rec in reversed(history):
        # One record counts every attempt superseded before it finished (promotion/history.py).
        count = f" x{rec['count']}" if isinstance(rec.get("count"), int) and rec["count"] > 1 else ""
        print(
            f"{rec.get('finishedAt', ''):<22}{rec.get('version', ''):<14}{rec.get('fromVersion') or '-':<14}"
            f"{rec.get('outcome', ''):<12}{rec.get('durationSeconds', 0):>9.0f}s  {rec.get('reason', '')}{count}",
            file=out,
        )


def condition_status(obj: dict[str, Any], type_: str) -> tuple[str, str]:
    """(status, reason) of a condition; ("Unknown", "") when the operator has not written it."""
    cond = _cond(obj, type_) or {}
    return str(cond.get("status") or "Unknown"), str(cond.get("reason") or "")


def summary(obj: dict[str, Any]) -> dict[str, Any]:
    """What `list` shows of one DecisionModel (and -o json/yaml gives per item)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    promo: dict[str, Any] = status["promotion"] if isinstance(status.get("promotion"), dict) else {}
    ready, reason = condition_status(obj, "Ready")
    weight = promo.get("weight") if promo.get("candidate") and promo.get("phase") in ("Progressing", "Paused") else None
    weight = weight if isinstance(weight, (int, float)) and not isinstance(weight, bool) else None
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "phase": promo.get("phase") or "Idle",
            "active": status.get("activeVersion") or promo.get("stable"), "candidate": promo.get("candidate"),
            "weight": weight, "ready": ready, "reason": reason}


def print_list(objs: list[dict[str, Any]], out: TextIO, all_namespaces: bool) -> None:
    rows = [summary(o) for o in objs]
    if not rows:
        print("No DecisionModels found.", file=out)
        return
    head = ["NAMESPACE"] if all_namespaces else []
    table = [[*head, "NAME", "PHASE", "ACTIVE", "CANDIDATE", "WEIGHT", "READY", "REASON"]]
    for r in rows:
        weight = f"{r['weight']}%" if isinstance(r["weight"], (int, float)) else "-"
        table.append([*([str(r["namespace"])] if all_namespaces else []), str(r["name"]), str(r["phase"]),
                      str(r["active"] or "-"), str(r["candidate"] or "-"), weight, r["ready"], r["reason"] or "-"])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)


def one_line(obj: dict[str, Any]) -> str:
    """A promotion in one line, for `status --timeout` as it changes: phase, versions, weight, Ready."""
    r = summary(obj)
    parts = [str(r["phase"]), f"active {r['active'] or '-'}"]
    if r["candidate"]:
        parts.append(f"candidate {r['candidate']}" + (f" at {r['weight']}%" if r["weight"] is not None else ""))
    parts.append(f"Ready={r['ready']}" + (f" ({r['reason']})" if r["reason"] else ""))
    return ", ".join(parts)
