"""Artifact checks shared by the DecisionModels that check one storageUri with the same credentials and serving
settings: a fleet created at once reads S3 once per model, not once per DecisionModel; a check seconds later reads
again; an Unknown verdict (S3 down) is never reused; a stopped reconcile's check is not lost for those that joined it.
The checks here count their reads instead of reading S3 (the S3 side is tested in test_storage_pool.py and the
cluster observers' tests)."""

from __future__ import annotations

import asyncio

import pytest
from arbiter_operator.observe.storage import SharedChecks
from arbiter_operator.plan.artifacts import ArtifactReport

VALID = ArtifactReport("True", "Valid", "fits")
DOWN = ArtifactReport("Unknown", "StorageUnreachable", "S3 did not answer")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Reads:
    """A check that takes `seconds` and answers `report`, counting how often it ran."""

    def __init__(self, report: ArtifactReport = VALID, seconds: float = 0.05) -> None:
        self.report, self.seconds, self.runs = report, seconds, 0

    async def __call__(self) -> ArtifactReport:
        self.runs += 1
        await asyncio.sleep(self.seconds)
        return self.report


KEY = ("creds-a", "s3://models/credit", "ask", "{}")


async def test_a_fleet_checking_one_model_at_once_reads_it_once():
    shared, reads = SharedChecks(), Reads()
    reports = await asyncio.gather(*[shared.check(KEY, reads) for _ in range(50)])
    assert reports == [VALID] * 50
    assert reads.runs == 1


async def test_other_credentials_or_another_uri_are_checked_on_their_own():
    shared, reads = SharedChecks(), Reads()
    other_creds = ("creds-b", *KEY[1:])
    other_uri = (KEY[0], "s3://models/fraud", *KEY[2:])
    await asyncio.gather(shared.check(KEY, reads), shared.check(other_creds, reads), shared.check(other_uri, reads))
    assert reads.runs == 3


async def test_a_check_after_the_ttl_reads_again():
    clock = Clock()
    shared, reads = SharedChecks(ttl=10.0, clock=clock), Reads()
    await shared.check(KEY, reads)
    clock.now = 9.0
    await shared.check(KEY, reads)
    assert reads.runs == 1  # seconds later: shared
    clock.now = 10.5
    await shared.check(KEY, reads)
    assert reads.runs == 2  # an upload or a deletion since is seen


async def test_an_unknown_verdict_is_shared_in_flight_only():
    shared, reads = SharedChecks(), Reads(DOWN)
    assert await asyncio.gather(shared.check(KEY, reads), shared.check(KEY, reads)) == [DOWN, DOWN]
    assert reads.runs == 1
    await shared.check(KEY, reads)
    assert reads.runs == 2  # S3 may be back: the next check asks it


async def _owner_and_joiner(reads: Reads) -> tuple[asyncio.Task[ArtifactReport], asyncio.Task[ArtifactReport]]:
    """A check under way (the owner) and one that joined it."""
    shared = SharedChecks()
    owner = asyncio.create_task(shared.check(KEY, reads))
    await asyncio.sleep(0.01)
    joiner = asyncio.create_task(shared.check(KEY, reads))
    await asyncio.sleep(0.01)
    return owner, joiner


async def test_a_cancelled_check_leaves_its_joiners_to_check_by_themselves():
    reads = Reads(seconds=0.2)
    owner, joiner = await _owner_and_joiner(reads)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert await joiner == VALID  # not cancelled with it
    assert reads.runs == 2


async def test_a_cancelled_joiner_does_not_cancel_the_check_it_joined():
    owner, joiner = await _owner_and_joiner(Reads(seconds=0.2))
    joiner.cancel()
    assert await owner == VALID
    assert joiner.cancelled()


async def test_a_check_that_failed_is_not_shared_afterwards():
    shared = SharedChecks()
    runs = 0

    async def broken() -> ArtifactReport:
        nonlocal runs
        runs += 1
        raise RuntimeError("a defect")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await shared.check(KEY, broken)
    assert runs == 2
