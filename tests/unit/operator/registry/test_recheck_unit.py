"""Unknown registry / artifact conditions bring the reconcile back by themselves, with a bounded backoff; a serving
version keeps what it was deployed with while storage cannot be read; a sync never re-registers what the delete
finalizer is archiving."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from arbiter_devenv.registryserver import free_port
from arbiter_operator.api.conditions import make_condition
from arbiter_operator.api.models import VersionStatus
from arbiter_operator.observe.storage import observe_artifacts
from arbiter_operator.plan.artifacts import ArtifactReport, to_observation
from arbiter_operator.plan.model import Observations, children_of
from arbiter_operator.plan.recheck import recheck_after, sooner
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render import render_configmap
from arbiter_operator.sync.registry import mark_deleting
from arbiter_operator.sync.registry import sync_registry_step as observe_registry
from support.factory import make_dm

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def unknown(type_: str, since: datetime):
    return make_condition(type_, "Unknown", "RegistryUnreachable", "down", 1, since)


def test_unknown_registry_is_rechecked_sooner_then_less_often_up_to_a_minute():
    waits = [recheck_after([unknown("Registered", T0)], T0 + timedelta(seconds=s)) for s in (0, 5, 20, 45, 3600)]
    assert waits == [5.0, 5.0, 20.0, 45.0, 60.0]


def test_only_outside_conditions_that_are_unknown_ask_for_a_recheck():
    assert recheck_after([make_condition("Registered", "True", "Registered", "", 1, T0)], T0) is None
    assert recheck_after([make_condition("Ready", "Unknown", "X", "", 1, T0)], T0) is None
    assert recheck_after([unknown("ArtifactsValid", T0), unknown("Registered", T0 - timedelta(hours=1))], T0) == 5.0


def test_the_earlier_requeue_wins():
    assert sooner(None, None) is None and sooner(2.0, None) == 2.0 and sooner(None, 5.0) == 5.0
    assert sooner(600.0, 5.0) == 5.0


def test_planner_requeues_while_registered_is_unknown():
    from arbiter_operator.api.promotion import PromotionStatus
    from arbiter_operator.plan import plan

    dm = make_dm(model="m", versions=["1.0.0"])
    dm.status.promotion = PromotionStatus(phase="Idle", stable="1.0.0")  # converged: nothing else asks for a requeue
    later = T0 + timedelta(seconds=30)
    assert plan(dm, Observations(), later).requeue_after is None
    assert plan(dm, Observations(extra_conditions=(unknown("Registered", T0),)), later).requeue_after == 30.0


def test_unreadable_storage_keeps_a_serving_diffusion_version_as_deployed():
    dm = make_dm(model="m", versions=["1.0.0"])
    cm = render_configmap(dm, dm.spec.versions[0], diffusion=True)
    previous = VersionStatus(name="1.0.0", phase="Ready", artifactsDigest="sha256:x")
    report = ArtifactReport("Unknown", "StorageCredentialsInvalid", "Secret gone")
    obs_in = Observations(children=children_of(ConfigMap={cm["metadata"]["name"]: cm}))

    from arbiter_operator.plan.artifacts import deployed_as_diffusion as _deployed_as_diffusion

    kept = to_observation(report, previous, _deployed_as_diffusion(obs_in, "1.0.0"))
    assert (kept.valid, kept.diffusion, kept.digest) == (True, True, "sha256:x")


async def test_missing_storage_secret_is_unknown_so_the_version_waits_instead_of_failing():
    class NoSecrets:  # the cluster's answer: no such Secret (the observe step's reads are awaited)
        async def aget(self, *_):
            return None

    dm = make_dm(model="m", versions=["1.0.0"])
    obs = await observe_artifacts(NoSecrets(), dm, Observations(), now=utc_now())
    [cond] = obs.extra_conditions
    assert (cond.status, cond.reason) == ("Unknown", "StorageCredentialsInvalid")
    assert obs.artifacts["1.0.0"].valid is None  # not deployed, not failed: checked again


async def test_a_sync_after_the_finalizer_started_writes_nothing():
    # The registry URL is dead: a sync would report Registered=Unknown. Marked as being deleted, it does not even try.
    dm = make_dm(model="m", versions=["1.0.0"], uid=str(uuid.uuid4()), registry={"url": f"http://127.0.0.1:{free_port()}"})
    tried = await observe_registry(None, dm, Observations(), now=utc_now())
    assert [c.status for c in tried.extra_conditions] == ["Unknown"]
    mark_deleting(dm.metadata.uid)
    skipped = await observe_registry(None, dm, Observations(), now=utc_now())
    assert skipped.extra_conditions == ()
