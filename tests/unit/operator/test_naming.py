"""Child names: injective per (namespace, DecisionModel, version), valid for every consumer (KServe included).

The property tests generate pairs of DecisionModels the CRD accepts (tests/support/naming_rules.py mirrors its name
rules; the cluster test in tests/cluster/operator/test_operator_ownership.py checks the predicate against the real
apiserver) from a tiny alphabet, so near-collisions such as `a` + `1-0` against `a-1` + `0` come up all the time.
"""

from __future__ import annotations

import re

from arbiter_operator.api import models as m
from arbiter_operator.api.models import isvc_name
from arbiter_operator.render.naming import derived_labels, derived_names
from hypothesis import given, settings
from hypothesis import strategies as st
from support.naming_rules import crd_accepts, legacy_isvc_name

ISVC_RE = re.compile(m.ISVC_NAME_PATTERN)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


names = st.text(alphabet="ab1-", min_size=1, max_size=12)
versions = st.lists(st.text(alphabet="01.-a", min_size=1, max_size=8), min_size=1, max_size=4)


@st.composite
def decision_models(draw: st.DrawFn) -> tuple[str, list[str], int]:
    name, vs, nodes = draw(names), draw(versions), draw(st.sampled_from([1, 2]))
    return name, vs, nodes


@settings(max_examples=3000, deadline=None)
@given(decision_models(), decision_models())
def test_two_decision_models_in_one_namespace_never_share_a_child(a, b) -> None:
    (na, va, xa), (nb, vb, xb) = a, b
    if not (crd_accepts(na, va, xa) and crd_accepts(nb, vb, xb)) or na == nb:
        return  # the apiserver refuses it, or it is one object (names are unique per namespace)
    assert not derived_names(na, va, xa) & derived_names(nb, vb, xb)


@settings(max_examples=2000, deadline=None)
@given(decision_models())
def test_every_version_gets_its_own_children_and_every_name_is_valid_for_its_consumer(a) -> None:
    name, vs, nodes = a
    if not crd_accepts(name, vs, nodes):
        return
    for v in vs:
        isvc = isvc_name(name, v)
        assert ISVC_RE.match(isvc) and len(isvc) <= (m.MAX_ISVC_NAME if nodes == 1 else m.MAX_ISVC_NAME_MULTINODE)
    assert len({isvc_name(name, v) for v in vs}) == len(vs)
    for kind, child in derived_names(name, vs, nodes):
        assert DNS_LABEL.match(child) and len(child) <= 63, (kind, child)  # Services, Routes: DNS labels
    assert all(len(value) <= 63 for value in derived_labels(name, vs, nodes))


def test_the_collision_an_sre_found_is_gone() -> None:
    assert legacy_isvc_name("a", "1-0") == legacy_isvc_name("a-1", "0")  # the old scheme: one name, two owners
    assert isvc_name("a", "1-0") != isvc_name("a-1", "0")


def test_limits_come_from_kserves_derivations() -> None:
    # app=isvc.<isvc>-predictor (KServe v0.17 GetRawServiceLabel(PredictorServiceName(name))) must fit a label value.
    longest = "x" * m.MAX_ISVC_NAME
    assert len(f"isvc.{longest}-predictor") == 63
    assert len(f"isvc.{'x' * m.MAX_ISVC_NAME_MULTINODE}-predictor-worker") == 63
    assert m.MAX_NAME_PLUS_VERSION == 46 and m.MAX_NAME_PLUS_VERSION_MULTINODE == 39


def test_crd_states_the_limits_in_its_messages() -> None:
    from arbiter_operator.api.crdgen import name_rules

    messages = " ".join(r["message"] for r in name_rules())
    for text in ("46 characters", "39 characters", "63 characters", "'--'", "[a-z]([-a-z0-9]*[a-z0-9])?"):
        assert text in messages


def test_route_default_host_too_long_for_a_dns_label_is_invalid_spec() -> None:
    """OpenShift's default host is <route>-<namespace>.<apps domain>; the namespace is beyond CEL's reach."""
    from arbiter_operator.plan import Observations, plan
    from support.factory import make_dm
    from test_planner import T0

    long_ns = "n" * 51  # "credit-limit-" + 51 = 64
    p = plan(make_dm(namespace=long_ns), Observations(), T0)
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.exposure.host" in ready["message"] and p.children is None
    raw = example_with_host()
    # spec.exposure.host takes the Route's problem away; what is left is KServe's predictor host label
    # (<isvc>-predictor-<namespace>), stricter than the Route's, which no exposure setting changes.
    hosted = plan(make_dm(raw, namespace=long_ns), Observations(), T0)
    stalled = next(c for c in hosted.status["conditions"] if c["type"] == "Stalled")
    assert "spec.exposure.host" not in stalled["message"] and "KServe names its predictor's host" in stalled["message"]
    fits = plan(make_dm(raw, namespace="n" * 33), Observations(), T0)  # 12 + 5 <= 50 - 33
    assert fits.children is not None


def example_with_host() -> dict:
    from support.examples import example

    raw = example()
    raw["spec"]["exposure"]["host"] = "credit.apps.example.com"
    return raw
