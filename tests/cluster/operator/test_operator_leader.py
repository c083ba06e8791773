"""The leader Lease protocol (leader.LeaderElector) on the real apiserver, with each replica's clock in the test's
hand: one holder at a time, a standby takes over only after an unrenewed lease duration, the fence closes before
that, and a hostile writer of the Lease for another identity cannot make two replicas lead at once or crash the
election. Each test runs the electors on an event loop of its own, as the operator does (one task, the operator's
aiohttp transport)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from arbiter_operator.kube.client import KubeError, NotLeader, RestKubeClient
from arbiter_operator.kube.leader import LEASE, LeaderElector
from arbiter_operator.kube.transport import LoopTransport
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from support.kubekit import raw_call


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pair(api, namespace, clock, lease=None):
    """Two electors on the running loop, each with a transport of its own (two replicas)."""
    lease = lease or f"lease-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    a = LeaderElector(LoopTransport(api.configuration, loop), namespace, lease, identity="a", clock=clock)
    b = LeaderElector(LoopTransport(api.configuration, loop), namespace, lease, identity="b", clock=clock)
    return a, b


async def _close(*electors):
    for elector in electors:
        await elector.transport.close()


def test_one_holder_takeover_after_a_lease_duration_and_writes_fenced(control_plane, namespace, api):
    asyncio.run(_takeover(namespace, api))


async def _takeover(namespace, api):
    clock = Clock()
    a, b = _pair(api, namespace, clock)
    assert await a.try_acquire_or_renew() and a.is_leader()
    assert not await b.try_acquire_or_renew() and not b.is_leader()
    # a stops renewing (killed, partitioned). b watches the same record for a lease duration before taking it ...
    clock.t += 14
    assert not await b.try_acquire_or_renew()
    # ... and a's fence closed before that: it counts itself leader only until the renew deadline.
    assert not a.is_leader()
    kube = RestKubeClient(api, fence=a.is_leader)
    with pytest.raises(NotLeader):
        await kube.aapply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": namespace}})
    assert client.CoreV1Api(api).list_namespaced_config_map(namespace, field_selector="metadata.name=x").items == []
    clock.t += 2
    assert await b.try_acquire_or_renew() and b.is_leader()
    # a comes back: the Lease is b's now, a does not take it back.
    assert not await a.try_acquire_or_renew() and not a.is_leader()
    await _close(a, b)


def test_release_hands_over_at_once(control_plane, namespace, api):
    async def main() -> None:
        clock = Clock()
        a, b = _pair(api, namespace, clock)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        await a.stop(release=True)
        assert not a.is_leader()
        assert await b.try_acquire_or_renew() and b.is_leader()
        await _close(a, b)

    asyncio.run(main())


# A hostile writer that claims the Lease for someone else (an empty holder is the release hand-over, and a writer
# impersonating a replica is out of reach of any Lease protocol: RBAC keeps both to the operator's ServiceAccount).
_hostile_spec = st.fixed_dictionaries({
    "holderIdentity": st.one_of(st.just("someone-else"), st.text(min_size=1, max_size=20)),
}, optional={
    "leaseDurationSeconds": st.integers(min_value=-5, max_value=100000),
    "renewTime": st.sampled_from(["2020-01-01T00:00:00.000000Z", "2099-01-01T00:00:00.000000Z"]),
    "leaseTransitions": st.integers(min_value=0, max_value=2**31 - 1),
})
_step = st.one_of(
    st.tuples(st.just("try"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("tick"), st.floats(min_value=0.5, max_value=20)),
    st.tuples(st.just("hostile"), _hostile_spec),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_step, min_size=1, max_size=8))
def test_never_two_leaders_whatever_a_hostile_writer_puts_in_the_lease(control_plane, namespace, api, steps):
    asyncio.run(_hostile_writer(namespace, api, steps))


async def _hostile_writer(namespace, api, steps):
    clock = Clock()
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    a, b = _pair(api, namespace, clock, lease)
    electors = {"a": a, "b": b}
    path = LEASE.path(namespace)
    for step in steps:
        if step[0] == "try":
            await electors[step[1]].try_acquire_or_renew()  # never raises
        elif step[0] == "tick":
            clock.t += step[1]
        else:
            spec = dict(step[1])
            if spec["holderIdentity"] in ("a", "b"):
                continue
            body = {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                    "metadata": {"name": lease, "namespace": namespace}, "spec": spec}
            try:
                try:
                    current = raw_call(api, "GET", f"{path}/{lease}")
                except KubeError:
                    raw_call(api, "POST", path, body=body)
                else:
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    raw_call(api, "PUT", f"{path}/{lease}", body=body)
            except KubeError as exc:
                assert exc.status == 422  # what the apiserver's validation refuses never reaches the electors
        assert not (a.is_leader() and b.is_leader())
        if step[0] == "try" and electors[step[1]].is_leader():  # who just looked and leads is the one it names
            assert raw_call(api, "GET", f"{path}/{lease}")["spec"]["holderIdentity"] == step[1]
    await _close(a, b)
