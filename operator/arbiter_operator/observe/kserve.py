"""Which name for the plain-Deployment mode the KServe in front of us accepts, learnt from KServe's own answer.

KServe's lines disagree on the name (docs/install.md, "Supported versions"): the 0.15 line (OpenShift AI 2.x, Open
Data Hub up to 3.3) knows only `RawDeployment` and gives any other value its cluster default, `Serverless` in
OpenShift AI 2.x's settings (a Knative service, no predictor Deployment); KServe 0.16 and later (Open Data Hub 3.4+)
call it `Standard`, still accept `RawDeployment`, and their defaulting webhook rewrites it to `Standard` on every
write. So `RawDeployment` is right everywhere for a first write, and the annotation KServe leaves on the object says
which name that KServe uses from then on: rendering that name keeps a converged reconcile free of writes on both.

Why not read it elsewhere: the `inferenceservice-config` ConfigMap lies in the platform's namespace (more RBAC, a
namespace that differs per distribution) and Open Data Hub's overlays set `defaultDeploymentMode: RawDeployment` on
both lines; the InferenceService CRD serves `v1beta1` on both, with no field that tells them apart. The webhook's
answer needs no permission and no request: it is in the watch cache already.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..api.names import ANN_DEPLOYMENT_MODE, RAW_DEPLOYMENT, STANDARD

RAW_MODE_NAMES = (STANDARD, RAW_DEPLOYMENT)


def kept_mode(isvcs: Iterable[dict[str, Any]]) -> str | None:
    """The plain-Deployment mode's name KServe left on these InferenceServices (Standard wins: a KServe that rewrote
    one has the new name), or None when none carries either (none yet, or someone else's value)."""
    seen = {((i.get("metadata") or {}).get("annotations") or {}).get(ANN_DEPLOYMENT_MODE) for i in isvcs}
    return next((name for name in RAW_MODE_NAMES if name in seen), None)


class DeploymentModes:
    """What the operator has learnt of its KServe, for DecisionModels that have no InferenceService yet.

    One per process. `mode_for(own)` is the name to render for a DecisionModel whose own InferenceServices are `own`:
    what KServe kept on them, else what it kept on the last ones seen, else `RawDeployment` (accepted by every line).
    """

    def __init__(self) -> None:
        self.learnt: str | None = None

    def mode_for(self, own: Iterable[dict[str, Any]]) -> str:
        kept = kept_mode(own)
        if kept is not None:
            self.learnt = kept
            return kept
        return self.learnt or RAW_DEPLOYMENT
