"""Artifact verdicts are reused for the same spec for a while (a valid one for an hour, an invalid one for five
minutes), and never when storage could not be asked."""

from __future__ import annotations

from arbiter_operator.observe.storage import VerdictCache
from arbiter_operator.plan.artifacts import ArtifactReport


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_settled_verdict_is_reused_until_ttl_or_new_generation() -> None:
    clock = Clock()
    cache = VerdictCache(ttl=300, clock=clock)
    reports = {"1.0.0": ArtifactReport("True", "ArtifactsValid", "ok", digest="d1")}
    cache.put("uid-a", "spec-3", reports)
    assert cache.get("uid-a", "spec-3") == reports
    assert cache.get("uid-a", "spec-4") is None  # the spec changed: check again
    assert cache.get("uid-b", "spec-3") is None
    clock.now = 301
    assert cache.get("uid-a", "spec-3") == reports  # valid: no Secret or S3 read while a large model loads
    clock.now = 3601
    assert cache.get("uid-a", "spec-3") is None  # an hour on, checked again


def test_an_invalid_verdict_is_checked_again_within_the_ttl() -> None:
    clock = Clock()
    cache = VerdictCache(ttl=300, clock=clock)
    reports = {"1.0.0": ArtifactReport("True", "ArtifactsValid", "ok"),
               "1.1.0": ArtifactReport("False", "WeightsMissing", "no weights")}
    cache.put("uid-a", "spec-3", reports)
    clock.now = 299
    assert cache.get("uid-a", "spec-3") == reports
    clock.now = 301
    assert cache.get("uid-a", "spec-3") is None  # a fixed bucket or rotated Secret is seen within the ttl


def test_unknown_verdicts_are_never_cached_and_new_generation_replaces_old() -> None:
    cache = VerdictCache(ttl=300, clock=Clock())
    cache.put("uid-a", "spec-1", {"1.0.0": ArtifactReport("Unknown", "StorageUnreachable", "down")})
    assert cache.get("uid-a", "spec-1") is None
    cache.put("uid-a", "spec-1", {"1.0.0": ArtifactReport("False", "WeightsMissing", "no weights")})
    cache.put("uid-a", "spec-2", {"1.0.0": ArtifactReport("True", "ArtifactsValid", "ok")})
    assert cache.get("uid-a", "spec-1") is None
    assert cache.get("uid-a", "spec-2")["1.0.0"].status == "True"


def test_objects_without_uid_are_always_checked() -> None:
    cache = VerdictCache(ttl=300, clock=Clock())
    cache.put("", "spec-1", {"1.0.0": ArtifactReport("True", "ArtifactsValid", "ok")})
    assert cache.get("", "spec-1") is None
