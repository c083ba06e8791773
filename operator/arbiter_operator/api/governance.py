"""Governance of a DecisionModel: who may call it (spec.access), which version decides which context (spec.routing)
and where its decisions are kept (spec.audit).

spec.access: the callers the operator grants what the runtime, and OpenShift AI's authenticating proxy, check before
a decision: `get` on the model's InferenceServices, one per live version. RBAC only adds: whoever may already `get`
the namespace's InferenceServices through other roles (the namespace's view, edit and admin roles include it) may
still call. spec.access names callers; it cannot take a right away.

spec.audit: every runtime writes each decision's audit record on its stdout; with `s3`, also to that bucket, in
batches, each object locked for the retention asked (S3 object lock). The operator checks the bucket before a version
serves (AuditReady).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .fields import Name, _cel, _checked, _Model, _rules

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The group every authenticated user belongs to: spelled `allAuthenticated: true`, so nobody grants it by accident.
ALL_AUTHENTICATED_GROUP = "system:authenticated"

Subject = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class ServiceAccountRef(_Model):
    name: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(pattern=DNS_SUBDOMAIN)
    namespace: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = Field(
        None, pattern=DNS_LABEL, description="Defaults to the DecisionModel's namespace.")


LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]  # prefix (253) / name (63)
LabelValue = Annotated[str, StringConstraints(max_length=63)]


class NetworkPeer(_Model):
    model_config = _checked(
        _cel("!(has(self.namespace) && has(self.namespaceLabels))",
             "a spec.access.network.from entry names its namespaces by namespace or by namespaceLabels, not both"),
        _cel("has(self.namespace) || has(self.namespaceLabels) || has(self.podLabels)",
             "a spec.access.network.from entry needs namespace, namespaceLabels or podLabels (podLabels alone: pods "
             "of the DecisionModel's own namespace)"),
    )
    namespace: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = Field(
        None, pattern=DNS_LABEL, description="A namespace whose pods may connect (by its kubernetes.io/metadata.name).")
    namespaceLabels: dict[LabelKey, LabelValue] | None = Field(
        None, max_length=16, description="Namespaces with these labels (all of them); {} is every namespace.")
    podLabels: dict[LabelKey, LabelValue] | None = Field(
        None, max_length=16, description="Only the pods with these labels there (all of them).")


class NetworkAccess(_Model):
    from_: list[NetworkPeer] = Field(
        default_factory=list, alias="from", max_length=32,
        description="Who may open connections to the model's predictor pods, besides what must: the OpenShift "
        "router, the monitoring stack and, while they call each other (shadow phase, context routing, multi-node), "
        "the model's own predictor pods.")


class AccessSpec(_Model):
    users: list[Subject] = Field(
        default_factory=list, max_length=64,
        description="Users who may call the model (as the cluster authenticates them, e.g. alice@example.com).",
        json_schema_extra=_rules(_cel(
            "self.all(u, u != 'system:anonymous')",
            "spec.access.users: system:anonymous is never a caller (the runtime needs a token the cluster accepts)",
        )),
    )
    groups: list[Subject] = Field(
        default_factory=list, max_length=64,
        description="Groups whose members may call the model (e.g. finance-analysts).",
        json_schema_extra=_rules(
            _cel(f"self.all(g, g != '{ALL_AUTHENTICATED_GROUP}')",
                 f"spec.access.groups: write allAuthenticated: true instead of {ALL_AUTHENTICATED_GROUP}, so "
                 "opening the model to every authenticated user is said in so many words"),
            _cel("self.all(g, g != 'system:unauthenticated')",
                 "spec.access.groups: system:unauthenticated is never a caller (the runtime needs a token the "
                 "cluster accepts)"),
        ),
    )
    serviceAccounts: list[ServiceAccountRef] = Field(
        default_factory=list, max_length=64,
        description="ServiceAccounts (of applications in this or other namespaces) that may call the model.")
    allAuthenticated: bool = Field(
        False, description="Every user the cluster authenticates may call the model (group system:authenticated).")
    network: NetworkAccess | None = Field(
        None, description="A NetworkPolicy on the model's predictor pods admitting only these peers (and what must "
        "reach them); unset: no NetworkPolicy (the namespace's own policies apply).")

    def subjects(self, namespace: str) -> list[dict[str, str]]:
        """The RoleBinding's subjects, sorted and without repeats."""
        rbac = "rbac.authorization.k8s.io"
        out = {("User", u, "") for u in self.users} | {("Group", g, "") for g in self.groups}
        out |= {("ServiceAccount", sa.name, sa.namespace or namespace) for sa in self.serviceAccounts}
        if self.allAuthenticated:
            out.add(("Group", ALL_AUTHENTICATED_GROUP, ""))
        return [{"kind": k, "name": n, "namespace": ns} if k == "ServiceAccount" else
                {"kind": k, "name": n, "apiGroup": rbac} for k, n, ns in sorted(out)]


# S3's bucket names: 3-63 lower-case letters, digits, dots and hyphens, a letter or digit at each end.
BUCKET = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"


class AuditS3(_Model):
    bucket: Annotated[str, StringConstraints(min_length=3, max_length=63)] = Field(
        pattern=BUCKET, description="The bucket the records go to.")
    prefix: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        "audit", pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$",
        description="Key prefix; objects are <prefix>/<model>/<version>/<yyyy>/<mm>/<dd>/<time>-<id>.jsonl.")
    secretName: Name = Field(
        description="Secret in the DecisionModel's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (an "
        "OpenShift AI data connection's keys): the runtimes write with them, the operator checks the bucket with them.")
    endpoint: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="S3 endpoint (e.g. MinIO, Ceph RGW); unset: AWS.")
    region: Annotated[str, StringConstraints(max_length=64)] | None = None


class AuditRetention(_Model):
    mode: Literal["GOVERNANCE", "COMPLIANCE"] = Field(
        description="S3 object lock mode of each record object: COMPLIANCE (nobody can delete or shorten it, not even "
        "the bucket's owner) or GOVERNANCE (users with s3:BypassGovernanceRetention can).")
    days: int = Field(ge=1, le=36500, description="How long each record object is kept from when it is written.")


class AuditSpec(_Model):
    model_config = _checked(_cel(
        "!has(self.retention) || has(self.s3)",
        "spec.audit.retention needs spec.audit.s3: records on stdout are kept as long as the log collector keeps them",
        ".retention",
    ))
    s3: AuditS3 | None = Field(None, description="Also write the records to S3 (stdout always has them).")
    retention: AuditRetention | None = Field(
        None, description="Object lock on each record object; the bucket must have object lock enabled.")
    required: bool = Field(
        True, description="A version is not promoted (and a first version does not serve) until the operator has "
        "checked the bucket holds the records as asked (AuditReady=True).")


# Headers a context may not be read from: the request's own framing and credentials, and the runtime's own headers.
RESERVED_HEADERS = ("authorization", "content-type", "content-length", "content-encoding", "host", "traceparent",
                    "tracestate", "x-remote-user", "x-arbiter-shadow", "x-arbiter-routed", "connection",
                    "transfer-encoding", "inference-header-content-length")


class ContextRoute(_Model):
    header: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        "x-decision-context", pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The request header that names the context, in lower case as HTTP/2 writes it (requests may "
        "spell it in any case).",
        json_schema_extra=_rules(_cel(
            "!(self in " + str(list(RESERVED_HEADERS)).replace("'", '"') + ")",
            "spec.routing.contexts[].header cannot be one of " + ", ".join(RESERVED_HEADERS)
            + ": the runtime reads those for the request itself",
        )),
    )
    value: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(
        pattern=r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
        description="The header's value that names this context (printable ASCII, compared exactly).")
    version: Annotated[str, StringConstraints(min_length=1, max_length=40)] = Field(
        description="The version that decides this context: one of spec.versions, kept warm while it is named here.")


class RoutingSpec(_Model):
    contexts: list[ContextRoute] = Field(
        default_factory=list, max_length=32,
        description="Contexts pinned to a version: a request whose header has the value is decided by that "
        "version, whatever spec.promote says; other requests (other values, no header) by the active version.",
        json_schema_extra=_rules(_cel(
            "self.all(c, self.exists_one(d, d.header == c.header && d.value == c.value))",
            "spec.routing.contexts: each header and value may be pinned once",
        )),
    )
