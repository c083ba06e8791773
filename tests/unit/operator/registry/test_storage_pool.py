"""The artifact checks' shared S3 clients: one per credentials and event loop, reused while in use, closed once idle
(also when no further check comes), never closed under a check that uses it."""

from __future__ import annotations

import asyncio

from arbiter_operator.clients.s3 import S3Credentials
from arbiter_operator.observe.storage import StoragePool
from support.polling import eventually_async

A = S3Credentials("AKIA-A", "secret-a", endpoint_url="https://s3.a.example")
B = S3Credentials("AKIA-B", "secret-b", endpoint_url="https://s3.a.example")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_checks_with_the_same_credentials_share_one_client_and_others_get_their_own():
    pool = StoragePool(idle=30.0, clock=Clock())
    async with pool.use(A) as first:
        pass
    async with pool.use(A) as again, pool.use(B) as other:
        assert again is first
        assert other is not first
    assert len(pool) == 2
    await pool.aclose()
    assert len(pool) == 0


async def test_an_idle_client_is_closed_but_never_one_in_use():
    clock = Clock()
    pool = StoragePool(idle=30.0, clock=clock)
    async with pool.use(A) as busy:
        http = busy._http()
        clock.now = 100.0
        async with pool.use(B):  # a later check looks for idle clients: A is in use, so it stays open
            pass
        assert not http.closed
    clock.now = 200.0
    async with pool.use(B) as fresh:
        pass
    assert http.closed  # A unused for 100 s: closed, its credentials dropped
    assert busy is not fresh and len(pool) == 1
    await pool.aclose()


async def test_idle_clients_are_closed_even_when_no_further_check_comes():
    pool = StoragePool(idle=0.05)
    async with pool.use(A) as storage:
        http = storage._http()
    # Closed by the reaper (idle 0.05 s, about a second of slack), with no further check to trigger it.
    await eventually_async(lambda: http.closed, 10, "the idle client closed")
    assert http.closed
    assert len(pool) == 0


async def test_a_pool_without_idle_time_keeps_nothing_after_its_owner_closes_it():
    pool = StoragePool(idle=0.0)
    async with pool.use(A) as storage:
        http = storage._http()
    await pool.aclose()
    assert http.closed and len(pool) == 0


async def test_checks_sharing_a_client_never_wait_for_each_others_connections():
    """A fleet's checks run at once (one per worker) against a slow S3: sharing a client must not make them queue for
    its connections until they time out, which a check with a client of its own never did."""
    from support.hostile_s3 import Answer, HostileS3

    s3 = HostileS3().start()
    try:
        s3.reset(lambda request: Answer(200, b'{"architectures": ["X"]}', stall=2.0))
        creds = S3Credentials("AKIA-A", "secret-a", endpoint_url=s3.endpoint_url)
        pool = StoragePool(idle=30.0)

        async def check() -> bytes | None:
            async with pool.use(creds) as storage:
                return await storage.get_bytes("models", "credit/config.json")

        answers = await asyncio.gather(*[check() for _ in range(16)])  # 16 workers, each answer 2 s late
        assert answers == [b'{"architectures": ["X"]}'] * 16
        assert s3.connections >= 16 and len(pool) == 1
        await pool.aclose()
    finally:
        s3.stop()
