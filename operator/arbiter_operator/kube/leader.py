"""Leader election on a `coordination.k8s.io/v1` Lease, so that several operator replicas can run and exactly one
reconciles and writes.

The protocol is client-go's (the same Lease fields, the same defaults: 15 s lease, 10 s renew deadline, 2 s retry):

- A candidate takes the Lease when nobody holds it, or when the holder's record (holder, renewTime) has not changed
  for a whole lease duration *as observed by the candidate's own clock* (no comparison of clocks across machines).
  Every write of the Lease carries the resourceVersion read just before (optimistic concurrency): of two candidates,
  one wins, the other gets a 409.
- The holder renews every retry period. It counts itself leader only until `renew_deadline` after the start of its
  last successful renewal; `renew_deadline` < `lease_duration`, so a holder that can no longer renew (partitioned,
  paused) stops writing before any other replica can take the Lease. `is_leader()` is that fence: the Kubernetes
  client checks it before every write (kube/client.py).
- A holder that lost the Lease exits (its caller's `on_lost`), like client-go's controllers: it restarts as a
  standby with a clean work queue. A holder that shuts down cleanly releases the Lease (an empty holderIdentity), so
  the standby takes over at its next retry instead of after a lease duration. Whoever can write the Lease can hand
  leadership over the same way: the Lease is as trusted as the operator's RBAC (only its ServiceAccount may write it).

The election is one task on the operator's event loop; its requests go through the operator's aiohttp transport
(kube/transport.py), not fenced (a candidate writes the Lease before it leads), each bounded by two retry periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..api import jsonfast
from ..api.names import COORDINATION_API
from .client import KubeError, answer_of
from .kinds import kind_of
from .transport import LoopTransport

log = logging.getLogger("arbiter.leader")

LEASE = kind_of(COORDINATION_API, "Lease")


def default_identity() -> str:
    """The pod name (hostname in a pod) plus a random suffix: a restarted process is a new candidate."""
    return f"{os.environ.get('ARBITER_POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _seconds(value: Any) -> float:
    """A Lease's number of seconds or transitions; 0 for anything else (a string, NaN, infinity: a hostile or broken
    writer), so that no answer makes the arithmetic raise."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        transport: LoopTransport,
        namespace: str,
        name: str = "arbiter-operator-leader",
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self.transport, self.namespace, self.name = transport, namespace, name
        self.identity = identity or default_identity()
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_started_leading, self.on_lost = on_started_leading, on_lost
        self.clock = clock
        self._renewed_at: float | None = None  # start of the last successful acquire/renew, while we hold it
        self._observed: tuple[str, str] | None = None  # the other holder's (holder, renewTime) last seen
        self._observed_at = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> dict[str, Any]:
        data = jsonfast.dumps(body) if body is not None else b""
        raw = data.encode() if isinstance(data, str) else data
        status, reason, answer = await self.transport.request(method, path, raw, [], "application/json",
                                                              timeout or self.retry_period * 2)
        return answer_of(method, path, status, reason, answer)

    # -- the fence -------------------------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        at = self._renewed_at
        return at is not None and self.clock() - at < self.renew_deadline

    # -- one round -------------------------------------------------------------------------------------------------
    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        started = self.clock()
        path = LEASE.path(self.namespace, self.name)
        try:
            lease: dict[str, Any] | None = await self._call("GET", path)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("could not read the leader Lease %s/%s: %s", self.namespace, self.name, exc)
                return False
            lease = None
        except Exception as exc:  # no answer (timeout, connection refused, cut): not renewed
            log.warning("could not read the leader Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        found = (lease or {}).get("spec")
        spec = dict(found) if isinstance(found, dict) else {}  # a wrong-shaped spec is rewritten whole
        holder = spec.get("holderIdentity") or ""
        holder = holder if isinstance(holder, str) else repr(holder)
        mine = holder == self.identity
        if lease is not None and holder and not mine:
            record = (holder, str(spec.get("renewTime") or spec.get("acquireTime") or ""))
            if record != self._observed:
                self._observed, self._observed_at = record, started
            # Never shorter than our own setting: a Lease written with a tiny duration (by a misconfigured or hostile
            # peer) must not let us take over while its holder may still count itself leader.
            duration = max(self.lease_duration, _seconds(spec.get("leaseDurationSeconds")))
            if started - self._observed_at < duration:
                # Held by another replica, and renewed within a lease duration of our own clock. If we thought we
                # held it, we do not any more: the fence closes now, not at the renew deadline.
                self._renewed_at = None
                return False
        now = _now_micro()
        new_spec = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "renewTime": now,
        }
        if not mine:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(_seconds(spec.get("leaseTransitions"))) + (1 if holder else 0)
        try:
            if lease is None:
                body = {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": new_spec}
                await self._call("POST", LEASE.path(self.namespace), body)
            else:
                body = {**lease, "spec": new_spec}
                await self._call("PUT", path, body)
        except KubeError as exc:
            if exc.status not in (409, 404):  # 409/404: another candidate was faster
                log.warning("could not write the leader Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        except Exception as exc:  # no answer (timeout, connection refused): not renewed
            log.warning("could not write the leader Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        if not mine:
            log.info("acquired the leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        self._renewed_at = started
        return True

    # -- the loop --------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        leading = False
        while not self._stop.is_set():
            try:
                ok = await self.try_acquire_or_renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or a transport error must not end the election loop silently
                log.warning("leader election round failed: %s", exc)
                ok = False
            if ok and not leading:
                leading = True
                if self.on_started_leading:
                    self.on_started_leading()
            elif leading and not self.is_leader():
                log.error("lost the leader Lease %s/%s (not renewed within %.0fs): stopping",
                          self.namespace, self.name, self.renew_deadline)
                leading = False
                self._renewed_at = None
                if self.on_lost:
                    self.on_lost()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.retry_period)

    def start(self) -> None:
        """Campaign in a task on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name="leader-election")

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning; with release, hand the Lease back (if still ours) so a standby takes over at once."""
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, self.retry_period * 3)
            except (TimeoutError, asyncio.CancelledError):
                pass
            except Exception as exc:
                log.warning("leader election ended with %s", exc)
        if release and self.is_leader():
            self._renewed_at = None
            path = LEASE.path(self.namespace, self.name)
            try:
                lease = await self._call("GET", path, timeout=5)
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"] = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                                     "renewTime": _now_micro()}
                    await self._call("PUT", path, lease, timeout=5)
                    log.info("released the leader Lease %s/%s", self.namespace, self.name)
            except Exception as exc:  # the standby then takes over after a lease duration instead
                log.warning("could not release the leader Lease: %s", exc)
