"""KServe's predictor host label `<name>--<version>-predictor-<namespace>` is one DNS label: a DecisionModel whose
name plus a version's name exceeds 50 - len(namespace) is InvalidSpec, naming this namespace's limit, before any
child is written (plan/validate.py); the CRD's 46 holds in short namespaces."""

from __future__ import annotations

from datetime import UTC, datetime

from arbiter_operator.api.models import (
    MAX_NAME_PLUS_VERSION,
    NAME_PLUS_VERSION_BEFORE_NAMESPACE,
    isvc_name,
    name_plus_version_limit,
)
from arbiter_operator.plan import Observations, plan
from arbiter_operator.plan.validate import host_label_problems
from hypothesis import given, settings
from hypothesis import strategies as st
from support.factory import make_dm
from support.paths import REPO

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _dm(name_len: int, version_len: int, namespace: str):
    version = "1" + "0" * (version_len - 1)
    return make_dm(name="m" * name_len, namespace=namespace, versions=[version])


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 45), st.integers(4, 40), st.integers(1, 40))
def test_the_limit_is_exactly_the_longest_host_label_kserve_accepts(ns_len, name_len, version_len):
    ns = "n" * ns_len
    dm = _dm(name_len, version_len, ns)
    host = f"{isvc_name(dm.metadata.name, dm.spec.versions[0].name)}-predictor-{ns}"
    fits = len(host) <= 63 and name_len + version_len <= MAX_NAME_PLUS_VERSION
    assert (host_label_problems(dm) == []) == fits, (len(host), name_plus_version_limit(ns))


def test_at_the_boundary_per_namespace_length():
    for ns_len in (4, 12, 20, 30):
        ns = "n" * ns_len
        limit = 50 - ns_len
        assert name_plus_version_limit(ns) == min(limit, MAX_NAME_PLUS_VERSION)
        assert host_label_problems(_dm(limit - 5, 5, ns)) == []
        (problem,) = host_label_problems(_dm(limit - 4, 5, ns))
        assert f"at most {limit} characters" in problem and f"in namespace {ns}" in problem
        assert f"the CRD admits {MAX_NAME_PLUS_VERSION}" in problem


def test_too_long_for_its_namespace_is_invalid_spec_and_writes_no_child():
    ns = "credit-risk-models-production"  # 29: name plus version at most 21
    dm = make_dm(name="credit-limit-scoring", namespace=ns, versions=["1.0.0"])  # 20 + 5
    p = plan(dm, Observations(), T0)
    assert p.children is None and p.deletions == []
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    stalled = next(c for c in p.status["conditions"] if c["type"] == "Stalled")
    assert (ready["status"], ready["reason"], stalled["status"]) == ("False", "InvalidSpec", "True")
    assert "at most 21 characters" in stalled["message"] and "spec.versions[1.0.0]" in stalled["message"]
    assert [e.reason for e in p.events] == ["InvalidSpec"]


def test_the_charts_admission_policy_and_the_crds_message_hold_the_operators_limit():
    """The chart's CEL cannot import the operator's constant: it is held to it here (the cluster test runs it)."""
    assert NAME_PLUS_VERSION_BEFORE_NAMESPACE == 50
    policy = (REPO / "helm" / "arbiter" / "templates" / "admissionpolicy.yaml").read_text()
    assert f'expression: "{NAME_PLUS_VERSION_BEFORE_NAMESPACE} - size(request.namespace)"' in policy
    crd = (REPO / "crds" / "arbiter.dev_decisionmodels.yaml").read_text()
    assert f"the limit is lower, {NAME_PLUS_VERSION_BEFORE_NAMESPACE} less the namespace" in crd
