"""Reads of a DecisionModel's model artifacts on S3 (config.json, the safetensors index, the listing, tokenizer.json),
checked by `plan.artifacts`, and the verdict cache that spares S3 the repeats of one change's reconciles.

Credentials come from `spec.storage` (a Secret in KServe's storage-config form, overrides, a CA ConfigMap). Never
raises for storage trouble: an outage or a credential problem is an Unknown verdict, checked again with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

from ..api import jsonfast
from ..api.names import CORE_API
from ..clients.s3 import (
    CredentialsInvalid,
    OwnCredentials,
    S3Credentials,
    S3Storage,
    StorageRejected,
    StorageUnreachable,
    credentials_from_secret,
    decode_secret_data,
)
from ..kube.client import KubeError
from ..plan.artifacts import (
    RECHECKED,
    STORAGE_ACCESS_DENIED,
    STORAGE_CREDENTIALS_INVALID,
    STORAGE_UNREACHABLE,
    WEIGHTS_MISSING,
    ArtifactReport,
    ServingAsk,
    artifacts_condition,
    check_artifacts,
    count_tokens,
    decision_to_count,
    deployed_as_diffusion,
    listing_digest,
    not_checkable,
    parse_json_object,
    parse_storage_uri,
    serving_ask,
    to_observation,
    token_cost_condition,
)
from ..plan.model import Observations


async def check_version_artifacts(storage: S3Storage | None, storage_uri: str, ask: ServingAsk,
                                  decision: Mapping[str, Any] | None = None) -> ArtifactReport:
    """Read config.json, the index and the listing under `storage_uri` and check them. Never raises for storage
    trouble: unreachable -> Unknown StorageUnreachable (retry), denied -> False StorageAccessDenied.

    `decision` (tokencost.decision_settings: scored mode only): also count the generated tokens per decision with
    the version's tokenizer.json."""
    scheme, bucket, prefix = parse_storage_uri(storage_uri)
    if scheme != "s3":
        return not_checkable(storage_uri)
    if storage is None:
        return ArtifactReport("Unknown", STORAGE_CREDENTIALS_INVALID,
                              f"no S3 credentials to read {storage_uri}; check spec.storage.secretName{RECHECKED}")
    base = f"{prefix}/" if prefix else ""
    try:
        listing = await storage.list_objects(bucket, prefix)
        keys = {o.key for o in listing}
        config_raw = await storage.get_bytes(bucket, base + "config.json") if "config.json" in keys else None
        index_raw = (
            await storage.get_bytes(bucket, base + "model.safetensors.index.json")
            if "model.safetensors.index.json" in keys else None
        )
        tokenizer_raw = (
            await storage.get_bytes(bucket, base + "tokenizer.json")
            if decision is not None and "tokenizer.json" in keys else None
        )
    except StorageUnreachable as exc:
        return ArtifactReport("Unknown", STORAGE_UNREACHABLE, f"{exc}; nothing that serves is touched")
    except CredentialsInvalid as exc:  # the operator's own credentials (a token STS refuses, none found)
        return ArtifactReport("Unknown", STORAGE_CREDENTIALS_INVALID, f"{exc}{RECHECKED}")
    except StorageRejected as exc:
        if exc.code == "NoSuchBucket":  # the URI names a bucket that does not exist: a defect of the spec
            return ArtifactReport("False", STORAGE_ACCESS_DENIED, f"{exc}; check the bucket name in storageUri")
        # Credentials or bucket policy: fixed outside the DecisionModel, so checked again until it passes.
        return ArtifactReport("Unknown", STORAGE_ACCESS_DENIED, f"{exc}; check the credentials in "
                              f"spec.storage.secretName and the bucket policy{RECHECKED}")
    config, config_error = parse_json_object(config_raw)
    index, index_error = parse_json_object(index_raw)
    if index_error:
        return ArtifactReport("False", WEIGHTS_MISSING, f"{storage_uri}: model.safetensors.index.json is not valid "
                              f"JSON ({index_error}); upload it again", digest=listing_digest(listing))
    report = check_artifacts(config, listing, ask, where=storage_uri, index=index, config_error=config_error)
    if decision is None:
        return report
    return replace(report, **count_tokens(tokenizer_raw, decision, storage_uri))


async def check_decision_model(storage: S3Storage | None, dm: Any) -> dict[str, ArtifactReport]:
    """Reports for every version of a `DecisionModel`, in spec order. Versions are checked one after another: a
    handful of small reads each, and one slow endpoint should not open many connections."""
    return {v.name: await check_version_artifacts(storage, v.storageUri, serving_ask(dm.spec, v),
                                                  decision_to_count(dm, v))
            for v in dm.spec.versions}


class SecretReads:
    """Storage Secrets read within the last `ttl` seconds (10), shared by the artifact checks of one namespace: a
    fleet created at once reads each namespace's Secret a few times instead of once per DecisionModel.

    Freshness: a check that starts more than `ttl` after a Secret changed reads the new one; a missing Secret is never
    remembered (creating it is seen at the next check). Only the Secret's data is held, and for `ttl` at most (expired
    entries are dropped at the next read), so credentials stay in memory seconds, not for the process's life."""

    def __init__(self, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._held: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def held(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret read within `ttl`, or None (no read made: callable on the event loop)."""
        now = self._clock()
        with self._lock:
            self._held = {k: v for k, v in self._held.items() if now - v[0] < self.ttl}
            hit = self._held.get((namespace, name))
        return hit[1] if hit is not None else None

    async def get(self, kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
        hit = self.held(namespace, name)
        if hit is not None:
            return hit
        now = self._clock()
        secret = await kube.aget(CORE_API, "Secret", namespace, name)
        if secret is not None and self.ttl > 0:
            with self._lock:
                self._held[(namespace, name)] = (now, {"data": secret.get("data")})
        return cast("dict[str, Any] | None", secret)


async def storage_credentials(kube: Any, dm: Any, bucket: str, secrets: SecretReads | None = None,
                              own: OwnCredentials | None = None) -> S3Credentials | ArtifactReport:
    """S3 credentials for `bucket` from `spec.storage` (Secret in storage-config form + overrides), reading the
    cluster through `kube`'s awaited reads (kube.client.KubeClient). An `ArtifactReport` instead when
    they cannot be had. `secrets`: recent Secret reads to share (None: read it). `own`: the operator's own AWS
    credentials, for an entry without keys (None: such an entry is refused)."""
    st = dm.spec.storage
    ns = dm.metadata.namespace
    try:
        reads = secrets if secrets is not None else SecretReads(ttl=0.0)
        secret = await reads.get(kube, ns, st.secretName)
        if secret is None:
            return ArtifactReport(
                "Unknown", STORAGE_CREDENTIALS_INVALID,
                f"Secret {st.secretName} not found in namespace {ns}; create it in KServe's storage-config form or "
                f"set spec.storage.secretName{RECHECKED}",
            )
        ca_pem = None
        if st.caBundleConfigMapRef is not None:
            cm = await kube.aget(CORE_API, "ConfigMap", ns, st.caBundleConfigMapRef.name)
            key = st.caBundleConfigMapRef.key or "ca.crt"
            ca_pem = ((cm or {}).get("data") or {}).get(key)
            if ca_pem is None:
                return ArtifactReport("Unknown", STORAGE_CREDENTIALS_INVALID,
                                      f"ConfigMap {st.caBundleConfigMapRef.name} (key {key}) with the S3 CA bundle "
                                      f"not found in namespace {ns}{RECHECKED}")
        creds = credentials_from_secret(
            decode_secret_data(secret.get("data")), secret_name=st.secretName, bucket=bucket, key=st.key,
            endpoint=st.endpoint, region=st.region, ca_bundle_pem=ca_pem, own=own,
        )
    except CredentialsInvalid as exc:
        return ArtifactReport("Unknown", STORAGE_CREDENTIALS_INVALID, f"{exc}{RECHECKED}")
    except KubeError as exc:
        return ArtifactReport("Unknown", STORAGE_UNREACHABLE, f"cannot read spec.storage references ({exc})")
    return creds


class SharedChecks:
    """Artifact checks shared by the DecisionModels that check the same storageUri with the same credentials and the
    same serving settings within `ttl` seconds (10), like the Secret reads: a fleet created at once that serves one
    model under many decision services (one set of weights, a DecisionModel per product or region) reads that prefix
    a few times, not once per DecisionModel. A check in flight is joined, not repeated.

    Freshness: a check that starts more than `ttl` after another one reads S3 again, so an upload or a deletion is
    seen within seconds; an Unknown verdict (S3 unreachable, access denied) is shared only by the checks that joined
    it in flight. The key holds the credentials as long as its entry (seconds), as the S3 client pool does."""

    def __init__(self, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._held: dict[tuple[Any, ...], tuple[float, asyncio.Future[ArtifactReport]]] = {}

    async def check(self, key: tuple[Any, ...], run: Callable[[], Any]) -> ArtifactReport:
        """The report of `run()` (a coroutine function) for `key`, shared as the class says."""
        now = self._clock()
        self._held = {k: v for k, v in self._held.items()
                      if not v[1].done() or (now - v[0] < self.ttl and _settled(v[1]))}
        held = self._held.get(key)
        if held is not None and held[1].get_loop() is asyncio.get_running_loop():
            try:
                return await asyncio.shield(held[1])  # a joiner's cancellation leaves the check to the others
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not held[1].cancelled() or (task is not None and task.cancelling()):
                    raise
                # The check it joined was cancelled (its reconcile was stopped): this one checks by itself.
        future: asyncio.Future[ArtifactReport] = asyncio.get_running_loop().create_future()
        if self.ttl > 0:
            self._held[key] = (now, future)
        try:
            report = await run()
        except asyncio.CancelledError:
            self._forget(key, future)
            future.cancel()
            raise
        except Exception as exc:
            self._forget(key, future)
            future.set_exception(exc)
            future.exception()  # retrieved: a check nobody joined must not log "never retrieved"
            raise
        future.set_result(report)
        return cast(ArtifactReport, report)

    def _forget(self, key: tuple[Any, ...], future: asyncio.Future[ArtifactReport]) -> None:
        if key in self._held and self._held[key][1] is future:
            del self._held[key]


def _settled(future: asyncio.Future[ArtifactReport]) -> bool:
    return not future.cancelled() and future.exception() is None and future.result().status != "Unknown"


@dataclasses.dataclass
class _Shared:
    storage: S3Storage
    last_use: float = 0.0
    users: int = 0  # checks using it now


class StoragePool:
    """S3 clients shared by the artifact checks that run on one event loop, one per credentials, closed once unused
    for `idle` seconds (30). A fleet's checks against one endpoint reuse its connections: a new client and a TLS
    handshake per check were a fifth of the operator's CPU while a fleet was created.

    A client is never closed while a check uses it. Credentials stay in memory as long as their client: seconds after
    the last check that needed them, not for the process's life."""

    def __init__(self, idle: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle = idle
        self._clock = clock
        self._held: dict[tuple[asyncio.AbstractEventLoop, S3Credentials], _Shared] = {}
        self._reapers: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.asynccontextmanager
    async def use(self, creds: S3Credentials) -> AsyncIterator[S3Storage]:
        loop = asyncio.get_running_loop()
        await self._close_idle(loop)
        entry = self._held.get((loop, creds))
        if entry is None:
            entry = self._held[(loop, creds)] = _Shared(S3Storage(creds, max_connections=None))
        entry.users += 1
        try:
            yield entry.storage
        finally:
            entry.last_use = self._clock()
            entry.users -= 1
            self._reap_later(loop)

    def _reap_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close idle clients even when no further check comes to do it."""
        if self.idle <= 0 or loop in self._reapers:
            return

        async def reap() -> None:
            await self._close_idle(loop)
            if any(k[0] is loop for k in self._held):
                self._reap_later(loop)

        def start() -> None:
            self._reapers.pop(loop, None)
            task = loop.create_task(reap())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._reapers[loop] = loop.call_later(self.idle + 1.0, start)

    async def _close_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        now = self._clock()
        for key, entry in list(self._held.items()):
            if key[0].is_closed():  # a finished loop took its connections with it
                del self._held[key]
            elif key[0] is loop and not entry.users and now - entry.last_use > self.idle:
                del self._held[key]
                await entry.storage.aclose()

    async def aclose(self) -> None:
        """Close the clients of the running loop (shutdown)."""
        loop = asyncio.get_running_loop()
        reaper = self._reapers.pop(loop, None)
        if reaper is not None:
            reaper.cancel()
        for key in [k for k in self._held if k[0] is loop]:
            await self._held.pop(key).storage.aclose()


async def check_decision_model_in_cluster(kube: Any, dm: Any, secrets: SecretReads | None = None,
                                          pool: StoragePool | None = None,
                                          shared: SharedChecks | None = None,
                                          own_credentials: OwnCredentials | None = None
                                          ) -> dict[str, ArtifactReport]:
    """`check_decision_model` with credentials resolved from the cluster, per bucket. `pool`: S3 clients to share
    (None: a client of its own per bucket, closed at the end). `shared`: recent checks of the same artifacts to share
    (None: check). `own_credentials`: the operator's own AWS credentials for entries without keys (None: refused)."""
    reports: dict[str, ArtifactReport] = {}
    creds: dict[str, S3Credentials | ArtifactReport] = {}
    own = StoragePool(idle=0.0) if pool is None else pool
    try:
        for v in dm.spec.versions:
            scheme, bucket, _ = parse_storage_uri(v.storageUri)
            if scheme != "s3":
                reports[v.name] = not_checkable(v.storageUri)
                continue
            if bucket not in creds:
                creds[bucket] = await storage_credentials(kube, dm, bucket, secrets, own_credentials)
            found = creds[bucket]
            if isinstance(found, ArtifactReport):
                reports[v.name] = found
                continue
            decision = decision_to_count(dm, v)
            ask = serving_ask(dm.spec, v)

            async def run(creds: S3Credentials = found, uri: str = v.storageUri,
                          decision: Mapping[str, Any] | None = decision, ask: ServingAsk = ask) -> ArtifactReport:
                async with own.use(creds) as storage:
                    report = await check_version_artifacts(storage, uri, ask, decision)
                return dataclasses.replace(report, storage_key=storage.entry_key)

            key = (found, v.storageUri, ask, jsonfast.dumps(decision, sort_keys=True))
            reports[v.name] = await shared.check(key, run) if shared is not None else await run()
    finally:
        if pool is None:
            await own.aclose()
    return reports


class VerdictCache:
    """Settled verdicts (True/False) per DecisionModel and spec: a False one for `ttl` seconds, a True one for
    `valid_ttl`.

    A reconcile runs several times per change (KServe's status updates, a predictor becoming available); reading the
    storage Secret and S3 again each time was the largest cost in the scale benchmark. A spec change (another spec
    digest) makes the check run again at once. A False verdict is checked again after `ttl` (5 minutes), so a fixed
    bucket or a rotated Secret is seen soon. A True verdict lasts `valid_ttl` (an hour): a version found valid is
    deployed (its pods read the weights themselves) and a later breakage of its storage does not stop a serving
    version anyway, so re-reading the Secret every 5 minutes while a large model loads bought nothing. Unknown
    verdicts are never cached: they are retried with backoff (plan/recheck.py).
    """

    def __init__(self, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 valid_ttl: float = 3600.0, own_credentials: OwnCredentials | None = None) -> None:
        """own_credentials: the operator's own AWS credentials, read with for storage-config entries without keys
        (settings.s3_own_credentials(); None: such an entry is refused, saying how to turn them on)."""
        self.ttl = ttl
        self.valid_ttl = max(ttl, valid_ttl) if ttl > 0 else ttl  # ttl=0: check every time (observe_artifacts)
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, dict[str, ArtifactReport]]] = {}
        self._digests: dict[str, str] = {}  # uid -> the spec digest of its entry (one entry per object)
        # The storage Secrets the checks read, shared for a few seconds, and their S3 clients (none kept when ttl is 0:
        # check every time).
        self.secrets = SecretReads(ttl=10.0 if ttl > 0 else 0.0, clock=clock)
        self.storages = StoragePool(idle=30.0) if ttl > 0 else None
        self.shared = SharedChecks(ttl=10.0, clock=clock) if ttl > 0 else None
        self.own_credentials = own_credentials

    def get(self, uid: str, spec_digest: str) -> dict[str, ArtifactReport] | None:
        if not uid:  # an object without identity (not from the apiserver) is always checked
            return None
        hit = self._entries.get((uid, spec_digest))
        if hit is None:
            return None
        valid = all(r.status == "True" for r in hit[1].values())
        if self._clock() - hit[0] > (self.valid_ttl if valid else self.ttl):
            return None
        return hit[1]

    def put(self, uid: str, spec_digest: str, reports: dict[str, ArtifactReport]) -> None:
        # Verdicts for this object's earlier specs are of no further use.
        earlier = self._digests.pop(uid, None)
        if earlier is not None:
            self._entries.pop((uid, earlier), None)
        if uid and all(r.status != "Unknown" for r in reports.values()):
            self._entries[(uid, spec_digest)] = (self._clock(), reports)
            self._digests[uid] = spec_digest


async def observe_artifacts(
    kube: Any, dm: Any, obs: Observations, now: datetime, cache: VerdictCache | None = None
) -> Observations:
    """The reconcile's storage read: artifacts per version + the `ArtifactsValid` (and `TokenCost`) condition, stamped
    with the reconcile's `now`. `cache`: the reconciler's VerdictCache (None: check every time)."""
    cache = VerdictCache(ttl=0.0) if cache is None else cache
    uid = dm.metadata.uid or ""
    spec_digest = hashlib.sha256(dm.spec.model_dump_json().encode()).hexdigest()
    reports = cache.get(uid, spec_digest)
    if reports is None:
        reports = await check_decision_model_in_cluster(kube, dm, cache.secrets, cache.storages, cache.shared,
                                                        cache.own_credentials)
        cache.put(uid, spec_digest, reports)
    previous = {v.name: v for v in dm.status.versions}
    return replace(
        obs,
        artifacts={v: to_observation(r, previous.get(v), deployed_as_diffusion(obs, v)) for v, r in reports.items()},
        extra_conditions=(*obs.extra_conditions, artifacts_condition(reports, dm.metadata.generation, now),
                          *(c for c in (token_cost_condition(reports, dm.metadata.generation, now),) if c is not None)),
    )
