"""DecisionModels as the plugin's pages and diagnosis read them: the parts they use, in the shapes the operator
writes, whatever the apiserver held (a status edited by hand, another operator version): one odd object shows what it
can and never breaks a page or a diagnosis."""

from __future__ import annotations

from typing import Any


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _formats(decision: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in decision.items() if k in ("trajectoryMode", "scoredFormat") and _text(v) is not None}


def _version(version: dict[str, Any]) -> dict[str, Any]:
    """A version's name and what makes its decisions faster (diagnose's fixes): its quantization and answer format."""
    quantization = _text(_dict(version.get("vllm")).get("quantization"))
    return {"name": version["name"], "decision": _formats(_dict(version.get("decision"))),
            **({"vllm": {"quantization": quantization}} if quantization is not None else {})}


def cleaned(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with the parts the pages read in the shapes the operator writes; anything else dropped (a status
    edited by hand, another operator version): one odd object shows what it can and never breaks a page."""
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    promo = _dict(status.get("promotion"))
    last = _dict(promo.get("lastAnalysis"))
    checks = [{k: v for k, v in c.items() if (k in ("name", "direction", "verdict") and isinstance(v, str))
               or (k in ("value", "bound") and _number(v) is not None)} for c in _dicts(last.get("checks"))]
    promotion = {k: v for k, v in promo.items() if _text(v) is not None and k in (
        "phase", "stable", "candidate", "previous", "failedVersion", "failureReason", "failureMessage", "startedAt")}
    if _number(promo.get("weight")) is not None:
        promotion["weight"] = promo["weight"]
    if last:
        promotion["lastAnalysis"] = {**{k: v for k, v in last.items() if _text(v) is not None}, "checks": checks}
    promotion["history"] = [{k: v for k, v in r.items() if _text(v) is not None or (k in ("durationSeconds", "count")
                             and _number(v) is not None)} for r in _dicts(promo.get("history"))]
    conditions = [{k: v for k, v in c.items() if _text(v) is not None} for c in _dicts(status.get("conditions"))]
    decision = _dict(spec.get("decision"))
    labels = [x for x in decision.get("labels") or [] if isinstance(x, str)] if isinstance(decision.get("labels"),
                                                                                          list) else []
    promote = {k: v for k, v in _dict(spec.get("promote")).items() if _text(v) is not None}
    serving = _dict(spec.get("serving"))
    vllm = {k: v for k, v in _dict(serving.get("vllm")).items()
            if _number(v) is not None or (k == "quantization" and _text(v) is not None)}
    return {"metadata": {k: v for k, v in meta.items() if (k in ("name", "namespace", "resourceVersion")
                         and _text(v) is not None) or (k == "generation" and isinstance(v, int))},
            "spec": {"promote": promote,
                     "decision": {"labels": labels, **{k: v for k, v in decision.items()
                                                       if k in ("deadlineMs", "confidenceThreshold")
                                                       and _number(v) is not None}, **_formats(decision)},
                     "versions": [_version(v) for v in _dicts(spec.get("versions")) if _text(v.get("name"))],
                     "serving": {"vllm": vllm, **{k: v for k, v in serving.items()
                                                  if k in ("gpus", "replicas") and _number(v) is not None}}},
            "status": {"conditions": conditions, "promotion": promotion,
                       **{k: v for k, v in status.items() if k in ("activeVersion", "url") and _text(v)},
                       **({"observedGeneration": status["observedGeneration"]}
                          if isinstance(status.get("observedGeneration"), int) else {})}}
