"""A new runtime image (operator upgrade, or a new Helm runtime.image) never restarts a serving version: each version
keeps the image it was deployed with, and the new image arrives with the next version deployed, i.e. as the
candidate of a canary promotion, analysed against the stable version still on the old image, and rolled back with
it. An explicit spec.serving.runtimeImage is the user's choice and applies to every live version."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from arbiter_operator.plan import Observations
from support.plannerdrive import Driver, two_versions

OLD, NEW = "registry.example.com/arbiter/runtime:0.1.0", "registry.example.com/arbiter/runtime:0.2.0"


class ImageDriver(Driver):
    default_image = OLD

    def observations(self, analysis: Any) -> Observations:
        return replace(super().observations(analysis), default_runtime_image=self.default_image)

    def rendered(self, kind: str) -> dict[str, Any]:
        """The child of this kind the latest pass rendered."""
        assert self.last is not None
        return next(c for c in self.last.children or [] if c["kind"] == kind)

    def image_of(self, version: str) -> str | None:
        for isvc in self.isvcs.values():
            if isvc["metadata"]["labels"]["arbiter.dev/version"] == version:
                return isvc["spec"]["predictor"]["model"].get("image")
        return None


def _serving_on_old_image() -> ImageDriver:
    d = ImageDriver(two_versions("1.0.0"))
    d.reconcile()
    d.set_ready("1.0.0")
    for _ in range(3):
        d.reconcile(1)
    assert d.image_of("1.0.0") == OLD
    return d


def test_operator_upgrade_keeps_the_stable_version_on_its_image():
    d = _serving_on_old_image()
    d.default_image = NEW  # the operator restarts with a new runtime image setting
    for _ in range(3):
        d.reconcile(30)
    assert d.image_of("1.0.0") == OLD  # not restarted: no untested image under all traffic at once
    runtime = d.rendered("ServingRuntime")
    assert runtime["spec"]["containers"][0]["image"] == NEW  # the template only
    status = {v["name"]: v for v in d.body["status"]["versions"]}
    assert status["1.0.0"]["runtimeImage"] == OLD


def test_new_image_arrives_as_the_canary_candidate_and_rolls_back_with_it():
    d = _serving_on_old_image()
    d.default_image = NEW
    d.edit_spec(version="1.1.0", strategy="Canary", steps=[{"weight": 10, "holdSeconds": 0}],
                analysis={"intervalSeconds": 5, "minRequests": 1, "insufficientTraffic": "Fail"})
    d.reconcile(1)
    assert (d.image_of("1.0.0"), d.image_of("1.1.0")) == (OLD, NEW)  # stable and candidate differ: a real canary
    d.set_ready("1.1.0")
    for _ in range(3):
        d.reconcile(1)
    route = d.rendered("Route")
    weights = {b["name"]: b["weight"] for b in [route["spec"]["to"], *route["spec"].get("alternateBackends", [])]}
    assert weights == {"credit-limit--1-0-0-predictor": 90, "credit-limit--1-1-0-predictor": 10}
    # The candidate on the new image breaches its SLA: the promotion fails and stable (old image) takes all traffic.
    for _ in range(4):
        d.reconcile(6, d.analysis(p95_s=5.0, errors=0.0, requests=100.0))
    assert d.body["status"]["promotion"]["phase"] == "Failed"
    route = d.rendered("Route")
    assert route["spec"]["to"]["name"] == "credit-limit--1-0-0-predictor" and route["spec"]["to"]["weight"] == 100
    assert d.image_of("1.0.0") == OLD


def test_an_explicit_runtime_image_applies_to_every_live_version():
    d = _serving_on_old_image()
    d.body["spec"]["serving"]["runtimeImage"] = "registry.example.com/arbiter/runtime:hotfix"
    d.body["metadata"]["generation"] += 1
    d.reconcile(1)
    assert d.image_of("1.0.0") == "registry.example.com/arbiter/runtime:hotfix"
