"""Shadow mode (champion/challenger): the stable version mirrors a sampled share of its live requests to a candidate.

The mirror runs after the caller's answer is decided, in a task of its own: the caller's response never waits for
it and never changes because of it. The candidate answers as it would any caller (its own metrics and audit count
the request, marked shadow by the `X-Arbiter-Shadow` header), and this runtime compares the two final labels row by
row: `arbiter_shadow_comparisons_total` (agreement, per-label confusion) and one audit record per compared row
(`"kind": "arbiter.shadow"`, `"shadow": true`).

Configuration: `shadow.json` next to decision.json (the operator adds it to the stable version's ConfigMap), re-read
every `poll_s` without a restart (the kubelet updates a mounted ConfigMap in place):

    {"candidate": "v2", "url": "http://credit-v2-predictor.ns.svc.cluster.local", "sampleRate": 0.1,
     "timeoutMs": 2000, "maxInFlight": 64, "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}

An absent or empty file, or `{}`, is "no shadowing". A file that cannot be used is logged once per content, counted
(`arbiter_shadow_config_errors_total`) and read as "no shadowing": serving never depends on it.

Bounds, whatever the candidate does (hangs, drips, answers 500, garbage or huge bodies, resets connections, invents
labels): at most `maxInFlight` mirrored requests wait at once (more are dropped and counted), each for at most
`timeoutMs`; an answer is read up to MAX_ANSWER_BYTES; the shadow's audit records never take the audit queue past
half its capacity (the callers' records keep the rest); candidate labels this version does not know are counted as
OTHER_LABEL, so a candidate cannot grow the metric's series.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .audit import AuditLog, Trace, now_iso
from .config import DecisionConfig
from .decide import Outcome, input_digest
from .jsonutil import dumps_bytes, loads
from .livefile import poll, read_bounded
from .metrics import Metrics
from .upstream import AnswerTooLarge, read_capped

log = logging.getLogger("arbiter.shadow")

SHADOW_HEADER = "X-Arbiter-Shadow"  # carries the stable version; the candidate marks the request shadow
SHADOW_FILE = "shadow.json"
DEFAULT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
OTHER_LABEL = "_other"  # cannot collide: configured labels start with a letter or a digit
MAX_CONFIG_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 1024 * 1024  # the mirror asks for the decision and source columns only: 256 rows fit in a few KiB
MAX_IN_FLIGHT = 4096
DEFAULT_SAMPLE_RATE = 0.1
DEFAULT_TIMEOUT_MS = 2000
DEFAULT_MAX_IN_FLIGHT = 64
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_KNOWN = {"candidate", "url", "sampleRate", "timeoutMs", "maxInFlight", "tokenFile"}


class ShadowConfigError(ValueError):
    """shadow.json cannot be used; the message names the key."""


@dataclass(frozen=True)
class ShadowConfig:
    candidate: str
    url: str
    sample_rate: float = DEFAULT_SAMPLE_RATE
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    token_file: str | None = None  # None: the pod's ServiceAccount token where it exists


def parse_shadow(raw: Any, own_version: str) -> ShadowConfig | None:
    """The decoded shadow.json: None for "no shadowing" ({}), a ShadowConfig, or ShadowConfigError."""
    if not isinstance(raw, dict):
        raise ShadowConfigError("shadow.json must be a JSON object (or {} for no shadowing)")
    if not raw:
        return None
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ShadowConfigError(f"unknown keys {unknown}; known keys are {sorted(_KNOWN)}")
    candidate = raw.get("candidate")
    if not isinstance(candidate, str) or not _VERSION_RE.match(candidate):
        raise ShadowConfigError("candidate: required, the candidate's version name (letters, digits, '_', '.', '-')")
    if candidate == own_version:
        raise ShadowConfigError(f"candidate: {candidate!r} is this runtime's own version; a version cannot shadow "
                                "itself")
    url = raw.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/?#]+(/[^\s?#]*)?$", url):
        raise ShadowConfigError("url: required, the candidate runtime's base http(s) URL, e.g. "
                                "http://credit-v2-predictor.ns.svc.cluster.local")
    rate = raw.get("sampleRate", DEFAULT_SAMPLE_RATE)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) \
            or not 0.0 <= rate <= 1.0:
        raise ShadowConfigError(f"sampleRate: {rate!r} must be a number from 0 to 1")
    timeout = raw.get("timeoutMs", DEFAULT_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 600_000:
        raise ShadowConfigError(f"timeoutMs: {timeout!r} must be an integer from 1 to 600000")
    in_flight = raw.get("maxInFlight", DEFAULT_MAX_IN_FLIGHT)
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise ShadowConfigError(f"maxInFlight: {in_flight!r} must be an integer from 1 to {MAX_IN_FLIGHT}")
    token_file = raw.get("tokenFile")
    if token_file is not None and (not isinstance(token_file, str) or not token_file):
        raise ShadowConfigError("tokenFile: must be the path of a file holding a bearer token")
    return ShadowConfig(candidate, url.rstrip("/"), float(rate), timeout, in_flight, token_file)


def parse_shadow_bytes(data: bytes, own_version: str) -> ShadowConfig | None:
    if not data.strip():
        return None
    if len(data) > MAX_CONFIG_BYTES:
        raise ShadowConfigError(f"shadow.json is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ShadowConfigError(f"shadow.json is not JSON: {str(exc)[:120]}") from None
    return parse_shadow(raw, own_version)


def shadow_path_for(decision_config: str | os.PathLike[str] | None) -> str | None:
    """shadow.json sits in the directory of decision.json (one ConfigMap, mounted as a directory)."""
    if not decision_config:
        return None
    return str(Path(decision_config).parent / SHADOW_FILE)


class CandidateFailure(Exception):
    """The candidate gave no usable answer; the message names what, never what it sent."""


class Shadow:
    def __init__(self, cfg: DecisionConfig, metrics: Metrics, audit: Callable[[], AuditLog | None],
                 path: str | None, poll_s: float = 2.0):
        self.cfg = cfg
        self.metrics = metrics
        self._audit = audit
        self.path = path
        self.poll_s = poll_s
        self.config: ShadowConfig | None = None
        self.in_flight = 0
        self._labels = frozenset(cfg.labels)
        self._last: bytes | None = None
        self._token: str | None = None
        self._token_key: tuple[str, int, int, int] | None = None
        self._token_warned: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._random = random.Random()
        metrics.shadow_in_flight.set_function(lambda: self.in_flight)

    # -- configuration -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.path is None:
            return
        self.reload()
        self._poller = asyncio.create_task(poll(self.reload, self.poll_s, self.path, log), name="shadow-config")

    def reload(self) -> None:
        """Read shadow.json again; a change of content takes effect for the next request."""
        assert self.path is not None
        data = read_bounded(self.path, MAX_CONFIG_BYTES)
        self._refresh_token()
        if data == self._last:
            return
        self._last = data
        try:
            config = parse_shadow_bytes(data, self.cfg.version)
        except ShadowConfigError as exc:
            self.metrics.shadow_config_errors.inc()
            if self.config is not None:
                log.error("%s: %s; shadowing to %s is off until it is fixed", self.path, exc, self.config.candidate)
            else:
                log.error("%s: %s; shadowing stays off", self.path, exc)
            self.config = None
            return
        if config != self.config:
            if config is None:
                log.info("shadowing off")
            else:
                log.info("shadowing %.0f%% of requests to version %s at %s (timeout %d ms, at most %d in flight)",
                         config.sample_rate * 100, config.candidate, config.url, config.timeout_ms,
                         config.max_in_flight)
                self.metrics.shadow_candidate(config.candidate, self.cfg.labels)
        self.config = config
        self._refresh_token()

    def _refresh_token(self) -> None:
        """Projected ServiceAccount tokens are rotated in place: re-read the file when it changes."""
        config = self.config
        if config is None:
            return
        path = config.token_file or DEFAULT_TOKEN_FILE
        try:
            st = os.stat(path)
            key = (path, st.st_mtime_ns, st.st_size, st.st_ino)
            if key != self._token_key:
                self._token = Path(path).read_text(encoding="utf-8").strip()[:16384] or None
                self._token_key = key
        except (OSError, UnicodeDecodeError) as exc:
            self._token, self._token_key = None, None
            if config.token_file and self._token_warned != path:
                self._token_warned = path
                log.warning("tokenFile %s cannot be read (%s); mirrored requests go without a token", path,
                            type(exc).__name__)

    # -- mirroring ---------------------------------------------------------------------------------------------
    def offer(self, outcomes: list[Outcome], canonicals: list[str], trace: Trace, request_id: str | None) -> None:
        """Called once the caller's answer is decided (a 200): maybe mirror it. Never raises, never waits."""
        try:
            self._offer(outcomes, canonicals, trace, request_id)
        except Exception:  # a defect in the mirror must not cost the caller the answer it already has
            log.exception("shadow mirror not started")

    def _offer(self, outcomes: list[Outcome], canonicals: list[str], trace: Trace, request_id: str | None) -> None:
        config = self.config
        if config is None or config.sample_rate <= 0.0:
            return
        if config.sample_rate < 1.0 and self._random.random() >= config.sample_rate:
            return
        audit = self._audit()
        n = len(outcomes)
        if audit is None or self.in_flight >= config.max_in_flight or not audit.reserve(n, audit.capacity // 2):
            self.metrics.shadow_result(config.candidate, "dropped")
            return
        self.in_flight += 1
        self.metrics.shadow_result(config.candidate, "sent")
        labels = [o.decision for o in outcomes]
        task = asyncio.create_task(self._mirror(config, audit, labels, canonicals, trace, request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mirror(self, config: ShadowConfig, audit: AuditLog, labels: list[str | None], canonicals: list[str],
                      trace: Trace, request_id: str | None) -> None:
        n = len(labels)
        recorded = 0
        started = time.perf_counter()
        try:
            error = None
            try:
                async with asyncio.timeout(config.timeout_ms / 1000):
                    answers = await self._ask(config, canonicals, trace, request_id)
            except TimeoutError:
                error = f"no answer within timeoutMs ({config.timeout_ms} ms)"
            except CandidateFailure as exc:
                error = str(exc)
            except aiohttp.ClientError as exc:
                error = f"the call failed ({type(exc).__name__})"
            except Exception as exc:  # whatever a hostile peer provokes is the candidate's failure, not ours
                error = f"the answer could not be read ({type(exc).__name__})"
            latency_ms = round((time.perf_counter() - started) * 1000, 3)
            base = {"kind": "arbiter.shadow", "time": now_iso(), "traceId": trace.trace_id, "spanId": trace.span_id,
                    "requestId": request_id, "model": self.cfg.model, "version": self.cfg.version,
                    "candidate": config.candidate, "shadow": True, "latencyMs": latency_ms}
            if error is not None:
                self.metrics.shadow_result(config.candidate, "error")
                audit.record({**base, "row": None, "rows": n, "result": "error", "error": error})
                recorded = 1
                return
            self.metrics.shadow_result(config.candidate, "compared")
            for row, (mine, (theirs, source)) in enumerate(zip(labels, answers, strict=True)):
                counted = theirs if theirs in self._labels else OTHER_LABEL
                agree = self.metrics.shadow_comparison(config.candidate, mine, counted)
                audit.record({**base, "row": row, "result": "compared", "inputDigest": input_digest(canonicals[row]),
                              "decision": mine, "candidateDecision": theirs[:64], "candidateSource": source,
                              "agree": agree})
                recorded += 1
        finally:
            audit.release(n - recorded)
            self.in_flight -= 1

    async def _ask(self, config: ShadowConfig, canonicals: list[str], trace: Trace,
                   request_id: str | None) -> list[tuple[str, str | None]]:
        """POST the same documents (same request id) to the candidate's V2 infer; its decision per row."""
        if self._session is None:
            # No connection limit of its own: maxInFlight bounds the calls. trust_env off: no proxy in between.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                                                  trust_env=False, skip_auto_headers=("User-Agent",))
        body: dict[str, Any] = {"inputs": [{"name": "input", "shape": [len(canonicals)], "datatype": "BYTES",
                                            "data": canonicals}],
                                "outputs": [{"name": "decision"}, {"name": "source"}]}
        if request_id is not None:
            body["id"] = request_id
        headers = {"content-type": "application/json", SHADOW_HEADER: self.cfg.version,
                   "traceparent": trace.traceparent}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        url = f"{config.url}/v2/models/{self.cfg.model}/infer"
        async with self._session.post(url, data=dumps_bytes(body), headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=config.timeout_ms / 1000)) as resp:
            if resp.status != 200:
                raise CandidateFailure(f"the candidate answered HTTP {resp.status}")
            try:
                content = await read_capped(resp, MAX_ANSWER_BYTES)
            except AnswerTooLarge as exc:
                raise CandidateFailure(f"the candidate's {exc}") from None
        return _decisions(loads(content), len(canonicals))

    async def stop(self) -> None:
        tasks = [t for t in (self._poller, *self._tasks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:  # cancelled, or whatever it ended with: shutting down either way
                pass
        if self._session is not None:
            await self._session.close()
            self._session = None


def _decisions(answer: Any, rows: int) -> list[tuple[str, str | None]]:
    """The decision (and source) column of a V2 infer response, or CandidateFailure saying what is wrong."""
    if not isinstance(answer, dict) or not isinstance(answer.get("outputs"), list):
        raise CandidateFailure("the answer is not a V2 infer response (no outputs)")
    columns = {o.get("name"): o.get("data") for o in answer["outputs"] if isinstance(o, dict)}
    decisions, sources = columns.get("decision"), columns.get("source")
    if not isinstance(decisions, list) or len(decisions) != rows:
        raise CandidateFailure(f"the answer has no decision column of {rows} row(s)")
    if not all(isinstance(d, str) and d for d in decisions):
        raise CandidateFailure("the answer's decision column holds something other than labels")
    if not isinstance(sources, list) or len(sources) != rows:
        sources = [None] * rows
    return [(d, s if isinstance(s, str) and s in ("model", "rules") else None)
            for d, s in zip(decisions, sources, strict=True)]
