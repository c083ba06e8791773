"""The decision server's state and lifecycle, apart from HTTP: start-up (tokens, upstream client, audit sinks,
shadow), readiness that follows the upstream, deciding a request's rows with their audit records, and shutdown
within the grace period. server.py puts HTTP in front of it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import vllm_processes
from .audit import AuditLog, S3BatchSink, S3Settings, Sink, StdoutSink, Trace, now_iso
from .auth import current_caller
from .config import DecisionConfig
from .decide import Decider, Outcome, canonical_json, input_digest
from .fallback import RulesEngine
from .inputs import canonicalise
from .metrics import Metrics
from .protocol import BadRequest
from .routing import ContextRouter
from .shadow import Shadow
from .supervisor import shutdown_grace_s
from .tokens import LabelTokens, TokenizerJsonSource, TokenizerRefused, UpstreamTokenizeSource, describe, resolve_for
from .trajectory import InputInvalid, InputValidator
from .upstream import UpstreamClient, UpstreamFailure

log = logging.getLogger("arbiter.runtime")

# Readiness turns false after this many failed upstream health checks in a row (and true at the next success).
UNREADY_AFTER_FAILED_CHECKS = 3
AUDIT_QUEUE_CAPACITY = 10_000


@dataclass
class RuntimeOptions:
    model_dir: str | None = None  # read tokenizer.json here; otherwise ask the upstream's /tokenize
    tokens: LabelTokens | None = None  # already resolved (the CLI checks the model before it starts the server)
    audit_sinks: list[Sink] | None = None  # default: stdout (+ S3 when ARBITER_AUDIT_S3_BUCKET is set)
    s3_settings: S3Settings | None = None
    upstream_poll_s: float = 0.5
    upstream_watch_s: float = 2.0  # health checks of the upstream once ready
    audit_capacity: int = AUDIT_QUEUE_CAPACITY
    on_fatal: Callable[[str], None] | None = None  # called when the model is refused after start-up
    shadow_config: str | None = None  # shadow.json to watch (serve: next to decision.json); None: never shadow
    shadow_poll_s: float = 2.0
    routing_config: str | None = None  # routing.json to watch (serve: next to decision.json); None: never route
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


async def resolve_from_model_dir(cfg: DecisionConfig, model_dir: str) -> LabelTokens:
    source = TokenizerJsonSource(model_dir)
    tokens = await resolve_for(source, cfg, source.description)
    log.info("label tokens resolved: %s", describe(tokens))
    return tokens


class Runtime:
    """State shared by the handlers: config, decider, audit, metrics, readiness."""

    def __init__(self, cfg: DecisionConfig, options: RuntimeOptions):
        self.cfg = cfg
        self.options = options
        self.rules = RulesEngine(cfg.fallback_rules)  # CEL compiled now: a bad rule stops start-up
        if not self.rules.has_default:
            log.warning("no catch-all fallback rule (when: \"true\") at the end of fallbackRules: an input no rule "
                        "matches gets a 503 when the model cannot decide it")
        objective = cfg.sla_p95_latency_ms / 1000.0 if cfg.sla_p95_latency_ms else None
        self.metrics = Metrics(cfg.model, cfg.version, objective_seconds=objective)
        self.metrics.configure_labels(cfg.labels)
        vllm_processes.register(self.metrics.registry, cfg.model, cfg.version, options.env)
        self.validator = InputValidator(cfg.input_schema)
        self.ready = False
        self.loaded = False  # the decider can decide (with the rules when the upstream is gone)
        self.not_ready_reason = "starting"
        self.fatal: str | None = None
        self.client: UpstreamClient | None = None
        self.decider: Decider | None = None
        self.audit: AuditLog | None = None
        self.shadow = Shadow(cfg, self.metrics, lambda: self.audit, options.shadow_config, options.shadow_poll_s)
        self.routing = ContextRouter(cfg.version, self.metrics, options.routing_config, options.shadow_poll_s)
        self._loader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.shutdown_grace_s = shutdown_grace_s(options.env)
        self.stop_requested_at: float | None = None  # time.monotonic() of the SIGTERM (set by the CLI)
        self.audit_lost: dict[str, int] | None = None  # per sink, once the audit is closed
        # Each engine's root (its OpenAI base URL without /v1): /health, /metrics.
        self.upstream_roots = tuple(url[:-3] if url.endswith("/v1") else url for url in cfg.upstream.urls)

    def _headers(self) -> dict[str, str]:
        name = self.cfg.upstream.api_key_env
        if name and self.options.env.get(name):
            return {"Authorization": f"Bearer {self.options.env[name]}"}
        return {}

    async def start(self) -> None:
        tokens = self.options.tokens
        if self.cfg.trajectory_mode == "scored" and tokens is None and self.options.model_dir:
            # Fail before listening: a refused tokenizer is a deployment error, not a runtime state.
            tokens = await resolve_from_model_dir(self.cfg, self.options.model_dir)
        self.client = UpstreamClient(self._headers())
        await self.client.start()
        self.decider = Decider(self.cfg, self.client, self.rules, self.metrics)
        sinks = self.options.audit_sinks
        if sinks is None:
            sinks = [StdoutSink()]
            s3 = self.options.s3_settings or S3Settings.from_env(self.options.env)
            if s3 is not None:
                s3_sink = S3BatchSink(s3, self.cfg.model, self.cfg.version)
                await s3_sink.start()
                sinks.append(s3_sink)
        else:
            for sink in sinks:
                if hasattr(sink, "start"):
                    await sink.start()
        for sink in sinks:  # each sink's error rate exists (as 0) from the first scrape, like the other ratios
            self.metrics.audit_write_errors.labels(*self.metrics.mv, type(sink).__name__)
        self.audit = AuditLog(sinks, self.options.audit_capacity,
                              on_write_error=lambda sink: self.metrics.audit_write_errors.labels(
                                  *self.metrics.mv, sink).inc())
        self.metrics.audit_depth.set_function(lambda: self.audit.depth if self.audit else 0)
        self._loader = asyncio.create_task(self._load(tokens), name="load")
        await self.shadow.start()
        await self.routing.start()

    async def _silent_upstreams(self) -> str:
        """The engines that do not answer, for a message; empty when every one does. Readiness needs them all: a
        pod with an engine gone serves a fraction of what it is sized for, and its supervisor restarts the
        container."""
        checks = await asyncio.gather(*(self._engine_healthy(root, url)
                                        for root, url in zip(self.upstream_roots, self.cfg.upstream.urls,
                                                             strict=True)))
        return " and ".join(root for root, ok in zip(self.upstream_roots, checks, strict=True) if not ok)

    async def _engine_healthy(self, root: str, base: str) -> bool:
        assert self.client is not None
        for url in (root + "/health", base + "/models"):
            status = await self.client.get_status(url)
            if status is None:
                return False
            if status == 200:
                return True
        return False

    async def _load(self, tokens: LabelTokens | None) -> None:
        waited = 0.0
        while silent := await self._silent_upstreams():
            self.not_ready_reason = f"waiting for the upstream at {silent}"
            if waited % 10 < self.options.upstream_poll_s:
                log.info("%s", self.not_ready_reason)
            await asyncio.sleep(self.options.upstream_poll_s)
            waited += self.options.upstream_poll_s
        assert self.decider is not None and self.client is not None
        if self.cfg.trajectory_mode == "scored" and tokens is None:
            source = UpstreamTokenizeSource(self.client, self.cfg.upstream.url, self.cfg.upstream.served_model_name)
            try:
                tokens = await resolve_for(source, self.cfg, source.description)
            except (TokenizerRefused, UpstreamFailure, ValueError) as exc:
                self.fatal = str(exc) if isinstance(exc, TokenizerRefused) else f"/tokenize failed: {exc}"
                self.not_ready_reason = self.fatal
                log.error("%s", self.fatal)
                if self.options.on_fatal:
                    self.options.on_fatal(self.fatal)
                return
            log.info("label tokens resolved: %s", describe(tokens))
        self.decider.load(tokens)
        # Everything loaded so far (libraries, compiled schemas and rules) lives as long as the process: keep it out
        # of the collector's full passes, which otherwise stall every request in flight for tens of milliseconds.
        gc.freeze()
        self.loaded = True
        self.ready = True
        self.not_ready_reason = ""
        self.metrics.upstream_up.set(1)
        log.info("ready: model %s version %s, %s mode, upstream %s", self.cfg.model, self.cfg.version,
                 self.cfg.trajectory_mode, self.cfg.upstream.url)
        self._watcher = asyncio.create_task(self._watch(), name="upstream-watch")

    async def _watch(self) -> None:
        """Readiness follows the upstream: a pod whose vLLM is gone leaves the Service's endpoints. Requests that
        still arrive are decided (by the rules: reason upstream_down), so a caller pinned to the pod gets answers."""
        failed = 0
        while True:
            await asyncio.sleep(self.options.upstream_watch_s)
            silent = await self._silent_upstreams()
            if not silent:
                if not self.ready:
                    log.info("upstream %s answers again: ready", " and ".join(self.upstream_roots))
                failed, self.ready, self.not_ready_reason = 0, True, ""
                self.metrics.upstream_up.set(1)
                continue
            failed += 1
            self.metrics.upstream_up.set(0)
            if failed >= UNREADY_AFTER_FAILED_CHECKS and self.ready:
                self.ready = False
                self.not_ready_reason = (f"the upstream at {silent} has not answered /health for "
                                         f"{failed} checks; decisions fall back to the rules")
                log.error("%s", self.not_ready_reason)

    async def stop(self) -> None:
        # One deadline from the signal for all of it, a moment before the grace period ends: the supervisor's
        # SIGKILL must not come before the audit's count is logged.
        grace = self.shutdown_grace_s
        deadline = (self.stop_requested_at or time.monotonic()) + grace - min(1.0, grace / 2)
        for task in (self._loader, self._watcher):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.shadow.stop()  # before the audit closes: a cancelled mirror gives its slots back
        await self.routing.stop()
        # Every sink gets until the deadline (S3 retried with backoff); what is missing is counted per sink.
        self.audit_lost = await self.audit.close(deadline) if self.audit is not None else {}
        if self.client is not None:
            await self.client.close()

    def check_rows(self, documents: list[Any]) -> tuple[list[Any], list[str]]:
        """Canonicalise and validate every row first (no token is spent on a bad batch); BadRequest names the row."""
        docs, canonicals = [], []
        for i, doc in enumerate(documents):
            try:
                doc = canonicalise(doc)
                self.validator.check(doc)
            except (InputInvalid, BadRequest) as exc:
                raise BadRequest(f"row {i}: {exc}" if len(documents) > 1 else str(exc)) from None
            docs.append(doc)
            canonicals.append(canonical_json(doc))
        return docs, canonicals

    async def decide_rows(self, documents: list[Any], canonicals: list[str], trace: Trace, started: float,
                          request_id: str | None) -> list[tuple[Outcome, dict[str, Any]]]:
        """Decide the rows concurrently; each comes with its audit record, written only if the row leaves."""
        if len(documents) == 1:
            return [await self._decide_one(documents[0], canonicals[0], trace, started, 0, request_id)]
        return list(await asyncio.gather(*(self._decide_one(d, c, trace, started, i, request_id)
                                           for i, (d, c) in enumerate(zip(documents, canonicals, strict=True)))))

    async def _decide_one(self, document: Any, canonical: str, trace: Trace, started: float, row: int,
                          request_id: str | None) -> tuple[Outcome, dict[str, Any]]:
        assert self.decider is not None
        out = await self.decider.decide(document, canonical, started)
        latency = time.perf_counter() - started
        if out.fallback_reason == "deadline":
            self.decider.reserve.observe(latency)
        self.metrics.decision(out.outcome, out.source, latency)
        record: dict[str, Any] = {
            "kind": "arbiter.decision", "time": now_iso(), "traceId": trace.trace_id, "spanId": trace.span_id,
            "parentSpanId": trace.parent_id, "requestId": request_id, "row": row, "model": self.cfg.model,
            "version": self.cfg.version, "inputDigest": input_digest(canonical), "decision": out.decision,
            "confidence": out.confidence, "source": out.source, "outcome": out.outcome, "lowConfidence": out.flagged,
            "fallbackReason": out.fallback_reason, "rule": out.rule, "trajectory": out.trajectory,
            "attempts": out.attempts, "latencyMs": round(latency * 1000, 3), "caller": current_caller(),
        }
        if out.error:
            record["error"] = out.error
        if out.notes:
            record["notes"] = out.notes  # why attempts failed: what an auditor asks when the rules decided
        return out, record
