"""The diagnosis: evidence in, findings out, ranked. Pure (no I/O, no clock), so every cause is unit-tested.

A finding names its cause (`code`, stable for scripts and tests), says it in one line, cites the numbers it rests on
and the fix. Its `score` ranks it: a model that serves nobody (100) before a rolled-back promotion (80) before a share
of decisions going wrong (20 + up to 75 by that share) before hints (under 20). Where one cause explains another
(vLLM queueing explains decisions over the deadline; inputs longer than maxModelLen explain vLLM's 4xx answers), one
finding carries both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..shapes import cleaned
from .evidence import Evidence, VersionMetrics

# What counts as a problem: a share of decisions at or above this, or any event of a kind that should never happen.
MIN_SHARE = 0.01
LOW_CONFIDENCE_SHARE = 0.05
KV_CACHE_FULL = 0.9
PROCESS_BOUND = 0.9  # cores: each vLLM process runs on one core (0.99 at its measured bound)
MAX_API_SERVERS = 16  # the CRD's maximum of spec.serving.vllm.apiServers
MAX_ENGINES = 8  # the CRD's maximum of spec.serving.vllm.engines
INPUT_NEAR_LIMIT = 0.9  # a prompt within this share of maxModelLen leaves no room for the answer
PROBLEM_SCORE = 20  # findings at or above it are problems (diagnose exits non-zero)
IDLE_VERSION_SCORE = 60  # the most a version that takes no traffic now scores (below a failed promotion's 80)


@dataclass
class Finding:
    code: str
    verdict: str
    score: float
    evidence: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    version: str | None = None


@dataclass
class Diagnosis:
    namespace: str
    name: str
    findings: list[Finding]
    unreadable: list[str]
    read: list[str]
    events: list[str]

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.score >= PROBLEM_SCORE]


@dataclass(frozen=True)
class Settings:
    """The spec values the fixes quote (the CRD's defaults where the object lacks them)."""

    max_model_len: int = 4096
    max_num_seqs: int = 64
    replicas: int = 1
    gpus: int = 1
    nodes: int = 1
    gpu_memory: float = 0.9
    api_servers: int = 1
    engines: int = 1
    deadline_ms: int | None = None
    confidence_threshold: float | None = None
    # Per version, what makes one decision faster and is not in use yet: "fp8" (vllm.quantization auto) and "fused"
    # (scored compact); a version the spec does not list (or no spec) is not named.
    speedups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, dm: dict[str, Any] | None) -> Settings:
        spec = (dm or {}).get("spec") or {}
        serving = spec.get("serving") or {}
        vllm = serving.get("vllm") or {}
        decision = spec.get("decision") or {}
        speedups: dict[str, tuple[str, ...]] = {}
        for version in spec.get("versions") or []:
            if not isinstance(version, dict):
                continue
            own_vllm, own_decision = version.get("vllm") or {}, version.get("decision") or {}
            quantization = own_vllm.get("quantization") or vllm.get("quantization") or "auto"
            mode = own_decision.get("trajectoryMode") or decision.get("trajectoryMode") or "scored"
            fmt = own_decision.get("scoredFormat") or decision.get("scoredFormat") or "compact"
            speedups[str(version.get("name"))] = (("fp8",) if quantization == "auto" else ()) + (
                ("fused",) if mode == "scored" and fmt == "compact" else ())

        def num(value: Any, fallback: Any) -> Any:
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else fallback

        return cls(max_model_len=num(vllm.get("maxModelLen"), 4096), max_num_seqs=num(vllm.get("maxNumSeqs"), 64),
                   replicas=num(serving.get("replicas"), 1), gpus=num(serving.get("gpus"), 1),
                   gpu_memory=num(vllm.get("gpuMemoryUtilization"), 0.9),
                   api_servers=num(vllm.get("apiServers"), 1), engines=num(vllm.get("engines"), 1),
                   nodes=num(serving.get("nodes"), 1),
                   deadline_ms=num(decision.get("deadlineMs"), None),
                   confidence_threshold=num(decision.get("confidenceThreshold"), None), speedups=speedups)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _share_score(share: float) -> float:
    return round(PROBLEM_SCORE + 75 * min(1.0, max(0.0, share)), 1)


# -- the cluster's word ---------------------------------------------------------------------------------------------


def _conditions(dm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in (dm.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def _table_row(reasons: Sequence[dict[str, str]], reason: str, condition: str, message: str) -> dict[str, str] | None:
    rows = [r for r in reasons if r.get("reason") == reason]
    exact = [r for r in rows if r.get("condition") == condition] or rows
    for row in exact:
        if row.get("when") and row["when"].removeprefix("naming ").strip() in message:
            return row
    plain = [r for r in exact if not r.get("when")] or exact
    return plain[0] if plain else None


def _condition_finding(cond: dict[str, Any], score: float, reasons: Sequence[dict[str, str]]) -> Finding:
    type_, status, reason = str(cond.get("type")), str(cond.get("status")), str(cond.get("reason") or "")
    message = str(cond.get("message") or "")
    row = _table_row(reasons, reason, f"{type_}={status}", message)
    evidence = [f"condition {type_}={status}, reason {reason}: {message}".rstrip(": ")]
    fix = [row["todo"]] if row else ["see docs/operations.md, \"Conditions\""]
    if row and row.get("happened"):
        evidence.append(f"the operator's table: {row['happened'][:400]}")
    return Finding(reason or type_, f"{type_} is {status}: {reason}", score, evidence, fix)


def cluster_findings(ev: Evidence, reasons: Sequence[dict[str, str]]) -> list[Finding]:
    """What the DecisionModel's status says: not Ready and why, a failed promotion, a spec not yet seen."""
    dm = ev.dm or {}
    status, meta = dm.get("status") or {}, dm.get("metadata") or {}
    if not status:
        return [Finding("NotReconciled", "the operator has not written a status on this DecisionModel", 60,
                        ["status is empty"], ["is the operator running and watching this namespace? "
                                              "`oc get pods -n <operator namespace>` and its log"])]
    out: list[Finding] = []
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    if isinstance(gen, int) and isinstance(observed, int) and observed < gen:
        out.append(Finding("SpecNotObserved", f"the operator has not processed generation {gen} yet (status is for "
                           f"{observed})", 25, [f"metadata.generation {gen}, status.observedGeneration {observed}"],
                           ["wait a moment; if it stays, check that the operator runs (its log names the error)"]))
    conds = _conditions(dm)
    promo = status.get("promotion") or {}
    failure = str(promo.get("failureReason") or "")
    for type_, score in (("Serving", 100), ("Exposed", 85), ("Stalled", 90), ("ArtifactsValid", 70),
                         ("Registered", 30), ("TokenCost", 10)):
        cond = conds.get(type_)
        bad = cond is not None and (cond.get("status") == "True") == (type_ == "Stalled")
        explained = (type_ == "Stalled" and cond is not None and cond.get("reason") == failure) or (
            type_ == "Exposed" and cond is not None and cond.get("reason") == "NoReadyBackend"
            and (conds.get("Serving") or {}).get("status") == "False")  # Serving's finding says why
        if bad and cond is not None and not explained:
            out.append(_condition_finding(cond, score, reasons))
    if promo.get("phase") in ("Failed", "RollingBack") and failure:
        out.append(_promotion_failure(promo, conds.get("Stalled"), reasons))
    ready = conds.get("Ready")
    if ready and ready.get("status") != "True" and not out:
        reason = str(ready.get("reason") or "")
        score = 10 if reason in ("Progressing", "WaitingForApproval") else 70
        out.append(_condition_finding(ready, score, reasons))
    return out


def _promotion_failure(promo: dict[str, Any], stalled: dict[str, Any] | None,
                       reasons: Sequence[dict[str, str]]) -> Finding:
    reason = str(promo.get("failureReason"))
    message = str(promo.get("failureMessage") or (stalled or {}).get("message") or "")
    candidate = promo.get("failedVersion") or promo.get("candidate")
    evidence = [f"promotion of {candidate} {promo.get('phase')}: {reason}: {message}".rstrip(": ")]
    for check in ((promo.get("lastAnalysis") or {}).get("checks") or []):
        if isinstance(check, dict) and check.get("verdict") == "Fail":
            word = "<=" if check.get("direction", "max") == "max" else ">="
            evidence.append(f"gate {check.get('name')}: {check.get('value')} (bound {word} {check.get('bound')})")
    row = _table_row(reasons, reason, "", message)
    fix = [row["todo"]] if row else []
    fix.append(f"then `kubectl arbiter retry NAME` or change spec.promote; {promo.get('stable')} serves meanwhile")
    return Finding(reason, f"the promotion of {candidate} was rolled back: {reason}", 80, evidence, fix,
                   str(candidate) if candidate else None)


def pod_findings(pods: Sequence[dict[str, Any]]) -> list[Finding]:
    """Predictor containers that restart, were killed for memory, or cannot start."""
    out: list[Finding] = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name"))
        for cs in ((pod.get("status") or {}).get("containerStatuses") or []):
            restarts = cs.get("restartCount") or 0
            last = ((cs.get("lastState") or {}).get("terminated") or {})
            waiting = ((cs.get("state") or {}).get("waiting") or {})
            if last.get("reason") == "OOMKilled":
                out.append(Finding("OOMKilled", f"{name}: container {cs.get('name')} was killed for memory "
                                   f"({restarts} restarts)", 75, [f"lastState.terminated: OOMKilled, exit code "
                                                                  f"{last.get('exitCode')}"],
                                   ["raise spec.serving.resources memory, or lower maxModelLen / maxNumSeqs"]))
            elif waiting.get("reason") in ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull",
                                           "CreateContainerConfigError"):
                out.append(Finding(str(waiting["reason"]), f"{name}: container {cs.get('name')} "
                                   f"{waiting['reason']}", 75, [str(waiting.get("message") or "")[:300]],
                                   [f"`oc logs --previous {name} -c {cs.get('name')}`; `oc describe pod {name}`"]))
            elif restarts >= 3:
                out.append(Finding("Restarts", f"{name}: container {cs.get('name')} restarted {restarts} times",
                                   40, [f"last exit: {last.get('reason')} {last.get('exitCode')}"],
                                   [f"`oc logs --previous {name} -c {cs.get('name')}`"]))
    return out


# A controller's write that lost a race with another writer: it reads again and retries (KServe says so in a Warning).
TRANSIENT = ("the object has been modified; please apply your changes to the latest version",)


def event_findings(events: Sequence[dict[str, Any]], explained: set[str], ready: bool) -> list[Finding]:
    """Warning Events whose reason no other finding names (one finding per reason, newest message); a model that is
    Ready has them as notes, and a lost write race (retried by its controller) is no finding at all."""
    latest: dict[str, dict[str, Any]] = {}
    for e in events:
        if any(words in str(e.get("message") or "") for words in TRANSIENT):
            continue
        if e.get("type") == "Warning" and e.get("reason") and e["reason"] not in explained:
            latest[str(e["reason"])] = e
    return [Finding(f"Event{reason}" if not reason.startswith("Event") else reason,
                    f"Warning Event {reason} on {(e.get('involvedObject') or {}).get('kind')} "
                    f"{(e.get('involvedObject') or {}).get('name')}", 10 if ready else 25,
                    [f"{e.get('count') or 1}x: {str(e.get('message') or '')[:300]}"],
                    ["`oc describe` the object it names; the Event's message says what failed"])
            for reason, e in latest.items()]


def describe_event(e: dict[str, Any]) -> str:
    obj = e.get("involvedObject") or {}
    when = e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp") or ""
    return (f"{when} {e.get('type', '')} {e.get('reason', '')} {obj.get('kind', '')}/{obj.get('name', '')}: "
            f"{' '.join(str(e.get('message') or '').split())[:200]}")


def diagnose(ev: Evidence, reasons: Sequence[dict[str, str]]) -> Diagnosis:
    from .metric_rules import metric_findings

    if ev.dm is not None:
        ev = dataclasses.replace(ev, dm=cleaned(ev.dm))
    findings = cluster_findings(ev, reasons) if ev.dm is not None else []
    findings += pod_findings(ev.pods or [])
    settings = Settings.of(ev.dm)
    weights = traffic(ev.dm)
    for version, m in sorted(ev.metrics.items()):
        found = metric_findings(m, settings, weights.get(version))
        if weights and not weights.get(version):
            # No traffic on it now (a rolled-back candidate): its numbers explain what happened, they hurt nobody.
            for f in found:
                f.score = min(f.score, IDLE_VERSION_SCORE)
                f.verdict += " (it takes no traffic now)"
            promotion = next((f for f in findings if f.version == version and f.score >= 80), None)
            if promotion is not None:
                promotion.evidence += [f"its own numbers: [{f.code}] {f.verdict}" for f in found]
        findings += found
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in ((ev.dm or {}).get("status") or {}).get("conditions") or [])
    findings += event_findings(ev.events or [], {f.code for f in findings}, ready)
    findings.sort(key=lambda f: -f.score)
    if not [f for f in findings if f.score >= PROBLEM_SCORE]:
        findings.append(Finding("NoProblemFound", "nothing wrong in what could be read", 0,
                                [f"read: {', '.join(ev.read) or 'nothing'}"],
                                ["if decisions still look wrong, read what could not be read (below)"]
                                if ev.unreadable else []))
    return Diagnosis(ev.namespace, ev.name, findings, ev.unreadable, ev.read,
                     [describe_event(e) for e in (ev.events or [])[-10:]])


def traffic(dm: dict[str, Any] | None) -> dict[str, float]:
    """version -> percent of traffic, as the promotion status says."""
    promo = ((dm or {}).get("status") or {}).get("promotion") or {}
    stable, candidate, weight = promo.get("stable"), promo.get("candidate"), promo.get("weight") or 0
    out: dict[str, float] = {}
    if stable:
        out[str(stable)] = 100.0 - weight if candidate else 100.0
    if candidate and candidate != stable:
        out[str(candidate)] = float(weight)
    return out


def share(part: float, m: VersionMetrics) -> float:
    return part / m.total if m.total else 0.0
