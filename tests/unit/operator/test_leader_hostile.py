"""The leader election (kube/leader.py) against a hostile apiserver (support/hostile_lease.py, a real HTTP server on
loopback serving Leases): error statuses with any body, 200 answers that are not a Lease or a Lease of the wrong
shape, writes whose answer is lost, hangs, resets and cut connections, and a third writer of the Lease.

What a user would notice if this broke: two replicas writing at once (both counting themselves leader), an election
that crashes instead of retrying, or a replica that lost the Lease and still writes. The clocks of the round-by-round
test are in the test's hand (both replicas read the same one); the run-loop tests run on real time, shortened.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from arbiter_operator.kube.leader import LeaderElector
from arbiter_operator.kube.transport import LoopTransport
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.hostile_lease import HostileLeaseServer

NS, LEASE = "ops", "arbiter-operator-leader"
# Short, so that a hang (the peer's 2 s) outlasts a request's bound (two retry periods).
PERIODS = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.25}

WRONG_LEASES = (
    b"", b"null", b"[]", b'"Lease"', b"{}", b"not json", b"[" * 50000, b'{"spec": "x"}', b'{"spec": [1, 2]}',
    b'{"spec": null, "metadata": "x"}', b'{"spec": {"holderIdentity": 5, "renewTime": {"a": 1}}}',
    b'{"spec": {"holderIdentity": "c", "leaseDurationSeconds": "forever", "leaseTransitions": 1e999}}',
    b'{"spec": {"holderIdentity": "", "leaseDurationSeconds": -3, "leaseTransitions": "x"}}',
    b'{"metadata": {"resourceVersion": 7}, "spec": {"holderIdentity": ["a"]}}',
)
STATUS_BODIES = (b"", b"<html>502 Bad Gateway</html>", b'{"kind": "Sta', b'{"kind": 5, "code": "409", "message": [1]}',
                 b'{"kind": "Status", "code": 409, "reason": "Conflict"}')
behaviour_st = st.one_of(
    st.sampled_from(["hang", "hang_after_headers", "reset", "close", "bad_status_line"]).map(lambda h: (h,)),
    st.tuples(st.just("status"), st.sampled_from([400, 403, 404, 409, 410, 422, 429, 500, 502, 503, 504]),
              st.sampled_from(STATUS_BODIES)),
    st.tuples(st.just("ok"), st.sampled_from(WRONG_LEASES)),
    st.just(("honest",)),
)
step_st = st.one_of(
    st.tuples(st.just("try"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("tick"), st.floats(min_value=0.1, max_value=2.0)),
    st.tuples(st.just("misbehave"), st.lists(behaviour_st, min_size=1, max_size=3)),
    # Another replica's write of the Lease as its own. (Not a release nor a write in a or b's name: whoever may write
    # the Lease can hand leadership over, which RBAC keeps to the operator's ServiceAccount; kube/leader.py.)
    st.tuples(st.just("third"), st.sampled_from([1, 15])),
)
RENEWALS = itertools.count()


@pytest.fixture(scope="module")
def peer():
    p = HostileLeaseServer().start()
    yield p
    p.stop()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _elector(peer: HostileLeaseServer, identity: str, name: str, **kw: Any) -> LeaderElector:
    transport = LoopTransport(peer.configuration(), asyncio.get_running_loop())
    return LeaderElector(transport, NS, name, identity=identity, **{**PERIODS, **kw})


def _renew_time() -> str:
    """A renewTime no write had before: each write is a new record to the electors."""
    return f"2026-01-01T00:00:00.{next(RENEWALS) % 1_000_000:06d}Z"


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(steps=st.lists(step_st, min_size=1, max_size=12))
def test_never_two_leaders_and_a_leader_is_the_lease_holder_whatever_the_apiserver_answers(peer, steps):
    name = f"lease-{id(steps)}-{time.monotonic_ns()}"

    async def run() -> None:
        clock = Clock()
        electors = {who: _elector(peer, who, name, clock=clock) for who in ("a", "b")}
        try:
            for step in steps:
                if step[0] == "try":
                    elector = electors[step[1]]
                    script_was_empty = not peer.script
                    won = await elector.try_acquire_or_renew()  # never raises, whatever the answer
                    if won:
                        # Only a committed write gets a 2xx: a replica that counts its write done holds the Lease.
                        assert peer.holder(NS, name) == step[1], (step, script_was_empty)
                    if not elector.is_leader():
                        assert not won
                elif step[0] == "tick":
                    clock.t += step[1]
                elif step[0] == "misbehave":
                    peer.script = list(step[1])
                else:
                    peer.write(NS, name, {"holderIdentity": "c", "leaseDurationSeconds": step[1],
                                          "renewTime": _renew_time()})
                assert not (electors["a"].is_leader() and electors["b"].is_leader()), step
        finally:
            peer.script = []
            for elector in electors.values():
                await elector.transport.close()

    asyncio.run(run())


async def _lead(peer: HostileLeaseServer, name: str) -> tuple[LeaderElector, asyncio.Event]:
    """An elector campaigning on its run loop, once it leads; the event is set when it reports the Lease lost."""
    lost = asyncio.Event()
    elector = _elector(peer, "a", name, on_lost=lost.set)
    elector.start()
    deadline = time.monotonic() + 10
    while not elector.is_leader() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert elector.is_leader()
    return elector, lost


@pytest.mark.parametrize("failure", [
    ("status", 503, b""), ("status", 409, STATUS_BODIES[-1]), ("status", 500, b"<html>"), ("hang",),
    ("hang_after_headers",), ("reset",), ("bad_status_line",), ("ok", b"[]"), ("ok", b'{"spec": "x"}'),
])
def test_a_leader_that_cannot_renew_closes_its_fence_in_time_and_never_writes_again(peer, failure):
    """The apiserver answers every request of the holder badly: its fence closes within the renew deadline of its
    last renewal (before any other replica could take the Lease, a lease duration on), it reports the Lease lost and
    sends nothing more, not even a release when stopped."""
    name = f"lease-{failure[0]}-{time.monotonic_ns()}"

    async def run() -> None:
        elector, lost = await _lead(peer, name)
        try:
            peer.script = [failure] * 1000
            failing_since = time.monotonic()
            fence_closed_after = None
            while time.monotonic() - failing_since < 5 and not lost.is_set():
                if fence_closed_after is None and not elector.is_leader():
                    fence_closed_after = time.monotonic() - failing_since
                await asyncio.sleep(0.01)
            assert lost.is_set(), "the lost Lease was never reported"
            if fence_closed_after is None and not elector.is_leader():
                # Closed and reported within one poll (a loaded machine): closed no later than now.
                fence_closed_after = time.monotonic() - failing_since
            assert fence_closed_after is not None and fence_closed_after < PERIODS["lease_duration"]
            peer.script = []  # the apiserver behaves again: the replica that lost still writes nothing
            lost_at = time.monotonic()
            await asyncio.sleep(4 * PERIODS["retry_period"])
            await elector.stop(release=True)
            assert not elector.is_leader()
            assert peer.writes_since(lost_at) == []
        finally:
            peer.script = []
            await elector.transport.close()

    asyncio.run(run())


def test_a_leader_whose_lease_another_replica_holds_stops_at_once_and_never_writes_again(peer):
    """Another replica writes the Lease as its own (it took over, or a hand-over): at its next round the holder sees
    it, closes its fence and reports the loss, and never writes the Lease again."""
    name = f"lease-taken-{time.monotonic_ns()}"

    async def run() -> None:
        elector, lost = await _lead(peer, name)
        try:
            peer.write(NS, name, {"holderIdentity": "b", "leaseDurationSeconds": 15, "renewTime": _renew_time()})
            taken_at = time.monotonic()
            await asyncio.wait_for(lost.wait(), 2 * PERIODS["renew_deadline"])
            assert not elector.is_leader()
            await asyncio.sleep(4 * PERIODS["retry_period"])
            await elector.stop(release=True)
            writes = peer.writes_since(taken_at)
            assert writes == [], writes
            assert peer.holder(NS, name) == "b"
        finally:
            await elector.transport.close()

    asyncio.run(run())


def test_what_the_apiserver_wrote_wrong_shaped_is_rewritten_whole_by_the_next_holder(peer):
    """A Lease whose spec is not an object (a broken writer, a proxy) is no holder's: a candidate takes it, writing a
    well-formed spec over it."""
    name = f"lease-wrong-{time.monotonic_ns()}"

    async def run() -> None:
        elector = _elector(peer, "a", name)
        try:
            peer.write(NS, name, {})
            with peer._lock:
                peer.leases[(NS, name)]["spec"] = "garbage"  # type: ignore[assignment]
            assert await elector.try_acquire_or_renew()
            with peer._lock:
                spec = dict(peer.leases[(NS, name)]["spec"])
            assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == int(PERIODS["lease_duration"])
        finally:
            await elector.transport.close()

    asyncio.run(run())
