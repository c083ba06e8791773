"""Who asked for a promotion: read once, by the pass that starts it (plan.Plan.needs_request), never by a converged one.

The watch cache holds DecisionModels without managedFields (api/kubejson.py: they are most of an object's bytes), so
the pass that starts a promotion reads its DecisionModel whole from the apiserver and takes the field manager that
last wrote `spec.promote.version`: `argocd-controller` for an Argo CD sync, `kubectl-client-side-apply` or `kubectl`
for a person's `oc apply` / `oc edit`, `kubectl-arbiter` for the plugin. (managedFields name the client, not the user:
the user behind a write is in the apiserver's audit log at that time.)

When Argo CD tracks the object (its `argocd.argoproj.io/tracking-id` annotation) and the operator knows where the
Application lives (`<namespace>_<app>` in the annotation, else `--argocd-namespace`), the Application's last sync
revision is the Git revision that asked. Reads that fail leave the field empty: the promotion goes on either way.
"""

from __future__ import annotations

import logging
from typing import Any

from ..api.models import DecisionModel
from ..api.names import API_VERSION, ARGOCD_API, ARGOCD_TRACKING_ANNOTATION, KIND
from ..kube.client import KubeClient, KubeError
from ..promotion.model import PromotionRequest

log = logging.getLogger("arbiter.observe")

MAX_FIELD = 128  # status.promotion.requestedBy's bound
MAX_REVISION = 256


def _owns_promote_version(entry: Any) -> bool:
    fields = entry.get("fieldsV1") if isinstance(entry, dict) else None
    spec = fields.get("f:spec") if isinstance(fields, dict) else None
    promote = spec.get("f:promote") if isinstance(spec, dict) else None
    return isinstance(promote, dict) and "f:version" in promote


def promote_writer(obj: dict[str, Any]) -> str | None:
    """The field manager that last wrote spec.promote.version (latest `time` among its owners; server-side apply lets
    several managers own a field they all set to one value). None: nobody (an object created before managedFields)."""
    entries = (obj.get("metadata") or {}).get("managedFields")
    owners = [e for e in entries if _owns_promote_version(e)] if isinstance(entries, list) else []
    named = [e for e in owners if isinstance(e.get("manager"), str) and e["manager"]]
    if not named:
        return None
    latest = max(named, key=lambda e: str(e.get("time") or ""))
    return str(latest["manager"])[:MAX_FIELD]


def application_of(annotations: dict[str, str], argocd_namespace: str | None) -> tuple[str, str] | None:
    """(namespace, name) of the Argo CD Application named by the tracking annotation; None: untracked, or the
    Application's namespace is unknown."""
    tracking = annotations.get(ARGOCD_TRACKING_ANNOTATION) or ""
    app = tracking.split(":", 1)[0].strip()
    if not app:
        return None
    if "_" in app:  # an Application outside Argo CD's namespace ("applications in any namespace")
        ns, _, name = app.partition("_")
        return (ns, name) if ns and name else None
    return (argocd_namespace, app) if argocd_namespace else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def synced_revision(app: dict[str, Any]) -> str | None:
    """The revision of the Application's last (or running) sync; several sources' revisions joined with commas."""
    status = _dict(app.get("status"))
    op = _dict(status.get("operationState"))
    candidates = (_dict(op.get("syncResult")), _dict(_dict(op.get("operation")).get("sync")),
                  _dict(status.get("sync")))
    for holder in candidates:
        rev = holder.get("revision")
        if isinstance(rev, str) and rev:
            return rev[:MAX_REVISION]
        revs = holder.get("revisions")
        if isinstance(revs, list) and revs and all(isinstance(r, str) for r in revs):
            return ",".join(revs)[:MAX_REVISION]
    return None


async def observe_request(client: KubeClient, dm: DecisionModel, argocd_namespace: str | None) -> PromotionRequest:
    """Who asked for what spec.promote says now; a field it cannot read stays None (logged, never raised)."""
    ns, name = dm.metadata.namespace, dm.metadata.name
    by = revision = None
    try:
        whole = await client.afresh(API_VERSION, KIND, ns, name)
        by = promote_writer(whole) if whole else None
    except KubeError as exc:
        log.warning("cannot read %s/%s whole for who asked for its promotion (%s %s)", ns, name, exc.status,
                    exc.reason)
    where = application_of(dm.metadata.annotations, argocd_namespace)
    if where is not None:
        try:
            app = await client.aget(ARGOCD_API, "Application", *where)
            revision = synced_revision(app) if app else None
        except KubeError as exc:
            log.warning("cannot read Argo CD Application %s/%s for the revision that promoted %s/%s (%s %s)",
                        where[0], where[1], ns, name, exc.status, exc.reason)
    return PromotionRequest(by=by, revision=revision)
