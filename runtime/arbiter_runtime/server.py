"""The decision server: KServe V2 REST + POST /v1/decisions + /metrics, one code path per decision."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import __version__, vllm_metrics
from .audit import AuditLog, S3BatchSink, S3Settings, Sink, StdoutSink, Trace, now_iso, trace_from_header
from .auth import AuthMiddleware, authenticator_from_env, current_caller
from .config import DecisionConfig
from .decide import Decider, Outcome, canonical_json, input_digest
from .edge import arrived
from .fallback import RulesEngine
from .inputs import BodyTooLarge, UnsupportedMediaType, canonicalise, read_json
from .jsonutil import dumps_bytes
from .metrics import Metrics
from .protocol import OUTPUT_METADATA, BadRequest, Outputs, infer_response, parse_infer, wants_json_readiness
from .shadow import SHADOW_HEADER, Shadow
from .supervisor import shutdown_grace_s
from .tensor_binary import HEADER_LENGTH, attach_inputs, encode_outputs
from .tokens import LabelTokens, TokenizerJsonSource, TokenizerRefused, UpstreamTokenizeSource, describe, resolve
from .trajectory import InputInvalid, InputValidator
from .upstream import UpstreamClient, UpstreamFailure

log = logging.getLogger("arbiter.runtime")

Handler = Callable[[Request], Awaitable[Response]]

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
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


async def resolve_from_model_dir(cfg: DecisionConfig, model_dir: str) -> LabelTokens:
    source = TokenizerJsonSource(model_dir)
    tokens = await resolve(source, cfg.labels, cfg.reasoning_codes, source.description, cfg.label_joiner)
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
        self.metrics = Metrics(cfg.model, cfg.version)
        self.metrics.configure_labels(cfg.labels)
        self.validator = InputValidator(cfg.input_schema)
        self.ready = False
        self.loaded = False  # the decider can decide (with the rules when the upstream is gone)
        self.not_ready_reason = "starting"
        self.fatal: str | None = None
        self.client: UpstreamClient | None = None
        self.decider: Decider | None = None
        self.audit: AuditLog | None = None
        self.shadow = Shadow(cfg, self.metrics, lambda: self.audit, options.shadow_config, options.shadow_poll_s)
        self._loader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.shutdown_grace_s = shutdown_grace_s(options.env)
        self.stop_requested_at: float | None = None  # time.monotonic() of the SIGTERM (set by the CLI)
        self.audit_lost: dict[str, int] | None = None  # per sink, once the audit is closed
        root = cfg.upstream.url
        self.upstream_root = root[:-3] if root.endswith("/v1") else root

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
        self.audit = AuditLog(sinks, self.options.audit_capacity,
                              on_write_error=lambda sink: self.metrics.audit_write_errors.labels(
                                  *self.metrics.mv, sink).inc())
        self.metrics.audit_depth.set_function(lambda: self.audit.depth if self.audit else 0)
        self._loader = asyncio.create_task(self._load(tokens), name="load")
        await self.shadow.start()

    async def _upstream_healthy(self) -> bool:
        assert self.client is not None
        for url in (self.upstream_root + "/health", self.cfg.upstream.url + "/models"):
            status = await self.client.get_status(url)
            if status is None:
                return False
            if status == 200:
                return True
        return False

    async def _load(self, tokens: LabelTokens | None) -> None:
        waited = 0.0
        while not await self._upstream_healthy():
            self.not_ready_reason = f"waiting for the upstream at {self.upstream_root}"
            if waited % 10 < self.options.upstream_poll_s:
                log.info("%s", self.not_ready_reason)
            await asyncio.sleep(self.options.upstream_poll_s)
            waited += self.options.upstream_poll_s
        assert self.decider is not None and self.client is not None
        if self.cfg.trajectory_mode == "scored" and tokens is None:
            source = UpstreamTokenizeSource(self.client, self.cfg.upstream.url, self.cfg.upstream.served_model_name)
            try:
                tokens = await resolve(source, self.cfg.labels, self.cfg.reasoning_codes, source.description,
                                       self.cfg.label_joiner)
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
            if await self._upstream_healthy():
                if not self.ready:
                    log.info("upstream %s answers again: ready", self.upstream_root)
                failed, self.ready, self.not_ready_reason = 0, True, ""
                self.metrics.upstream_up.set(1)
                continue
            failed += 1
            self.metrics.upstream_up.set(0)
            if failed >= UNREADY_AFTER_FAILED_CHECKS and self.ready:
                self.ready = False
                self.not_ready_reason = (f"the upstream at {self.upstream_root} has not answered /health for "
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


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps_bytes(content)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return FastJSONResponse({"error": message}, status_code=status, headers=headers)


def _timing(outcomes: list[Outcome], started: float) -> str:
    upstream = max((o.upstream_s for o in outcomes), default=0.0)
    total = time.perf_counter() - started
    return f"upstream;dur={upstream * 1000:.3f}, total;dur={total * 1000:.3f}"


def _answer(body: Any, headers: dict[str, str]) -> Response:
    """A JSON answer, or (bytes, JSON header length): one in the binary tensor data extension's framing."""
    if isinstance(body, tuple):
        content, head = body
        return Response(content, media_type="application/octet-stream", headers={**headers, HEADER_LENGTH: str(head)})
    return FastJSONResponse(body, headers=headers)


def _boundary(handler: Handler) -> Handler:
    """Every answer is a decision, a 4xx naming the problem or a 503 saying why: never a 500.

    Caught here, inside the route, so the connection stays usable (an exception that reaches the server
    middleware closes a keep-alive connection)."""
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except UnsupportedMediaType as exc:
            return _error(415, str(exc))
        except BodyTooLarge as exc:
            return _error(413, str(exc))
        except BadRequest as exc:
            return _error(400, str(exc))
        except ClientDisconnect:  # the caller left mid-body (or the edge closed a slow one): nobody to answer
            log.debug("client disconnected during %s %s", request.method, request.url.path)
            return Response(status_code=499)
        except Exception as exc:  # a defect: say so, log it, keep serving
            log.exception("unexpected error answering %s %s", request.method, request.url.path)
            return _error(503, f"the decision server could not answer ({type(exc).__name__}); retry, and report "
                               "it if it persists")
    return wrapped


def create_app(cfg: DecisionConfig, options: RuntimeOptions | None = None) -> Starlette:
    rt = Runtime(cfg, options or RuntimeOptions())
    model, version = cfg.model, cfg.version

    def check_model(request: Request) -> JSONResponse | None:
        name = request.path_params["name"]
        v = request.path_params.get("version")
        if name != model:
            return _error(404, f"unknown model {name!r}; this server serves {model!r}")
        if v is not None and v != version:
            return _error(404, f"unknown version {v!r} of model {model!r}; this server serves version {version!r}")
        return None

    async def live(_: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        vary = {"vary": "accept"}  # the unready answer depends on Accept: a cache must not mix them
        if rt.ready:
            return JSONResponse({"ready": True}, headers=vary)
        status = 200 if wants_json_readiness(request.headers.get("accept")) else 503
        return JSONResponse({"ready": False, "error": rt.not_ready_reason}, status_code=status, headers=vary)

    async def server_meta(_: Request) -> Response:
        return JSONResponse({"name": "arbiter-runtime", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def model_meta(request: Request) -> Response:
        if (err := check_model(request)) is not None:
            return err
        return JSONResponse({
            "name": model, "versions": [version], "platform": "arbiter-vllm",
            "inputs": [{"name": "input", "datatype": "BYTES", "shape": [-1]}],
            "outputs": OUTPUT_METADATA,
            "parameters": {"labels": list(cfg.labels), "reasoningCodes": list(cfg.reasoning_codes),
                           "steps": cfg.steps, "trajectoryMode": cfg.trajectory_mode},
        })

    async def model_ready(request: Request) -> Response:
        if (err := check_model(request)) is not None:
            return err
        if rt.ready:
            return JSONResponse({"name": model, "ready": True})
        return JSONResponse({"name": model, "ready": False, "error": rt.not_ready_reason}, status_code=503)

    def admit(headers: dict[str, str]) -> JSONResponse | None:
        if not rt.loaded:
            return _error(503, f"model {model} is not ready: {rt.not_ready_reason}", headers)
        return None

    async def decide_audited(documents: list[Any], trace: Trace, started: float, req_id: str | None,
                             headers: dict[str, str], shadow: bool) -> tuple[list[Outcome], list[str]] | JSONResponse:
        """Decide the rows and write the audit records of exactly the rows whose answer leaves the server:
        every row of a 200; on a 503 for want of a decision, the rows that had none (their error leaves).
        Returns the outcomes and the rows' canonical JSON."""
        assert rt.audit is not None
        docs, canonicals = rt.check_rows(documents)
        n = len(docs)
        if not rt.audit.reserve(n):
            rt.metrics.audit_refused.labels(*rt.metrics.mv).inc()
            return _error(503, f"audit queue full ({rt.audit.depth} records waiting to be written); no decision is "
                               "made that could not be recorded; retry later", {**headers, "retry-after": "1"})
        recorded = 0
        try:
            decided = await rt.decide_rows(docs, canonicals, trace, started, req_id)
            failed = [i for i, (o, _) in enumerate(decided) if o.decision is None]
            leaving = failed or range(n)
            for i in leaving:
                record = decided[i][1]
                record["shadow"] = shadow
                rt.audit.record(record)
                recorded += 1
        finally:
            rt.audit.release(n - recorded)
        if failed:
            first = decided[failed[0]][0]
            return FastJSONResponse({"error": f"no decision for row(s) {failed}: {first.error}", "rows": failed},
                                    status_code=503, headers=headers)
        for out, _ in decided:
            rt.metrics.answered(out.decision)  # the decision mix counts what left the server
        return [o for o, _ in decided], canonicals

    async def serve(request: Request, started: float, read: Any, answer: Any) -> Response:
        """The decision path both endpoints share: admit, read the rows (`read`: request -> documents, request id,
        what the answer needs), decide and audit, answer (`answer`: outcomes, trace, request id, that -> body),
        mirror to the candidate (never a mirrored request itself: no loops)."""
        trace = trace_from_header(request.headers.get("traceparent"))
        headers = {"traceparent": trace.traceparent}
        if (err := admit(headers)) is not None:
            return err
        shadow = SHADOW_HEADER in request.headers
        try:
            documents, req_id, wanted = await read(request)
            result = await decide_audited(documents, trace, started, req_id, headers, shadow)
        except BadRequest as exc:
            return _error(400, str(exc), headers)
        if isinstance(result, Response):
            return result
        outcomes, canonicals = result
        headers["server-timing"] = _timing(outcomes, started)
        response = _answer(answer(outcomes, trace, req_id, wanted), headers)
        if not shadow:
            rt.shadow.offer(outcomes, canonicals, trace, req_id)
        return response

    async def read_infer(request: Request) -> tuple[list[Any], str | None, Outputs]:
        document, binary = await read_json(request.headers, request.stream(), framed=True)
        return parse_infer(attach_inputs(document, binary))

    def answer_infer(outcomes: list[Outcome], trace: Trace, req_id: str | None, wanted: Outputs) -> Any:
        params = {"trace_id": trace.trace_id, "traceparent": trace.traceparent}
        body = infer_response(model, version, req_id, outcomes, params, wanted)
        return encode_outputs(body, wanted.binary) if wanted.binary else body

    async def read_decision(request: Request) -> tuple[list[Any], None, None]:
        return [(await read_json(request.headers, request.stream()))[0]], None, None

    def answer_decision(outcomes: list[Outcome], trace: Trace, req_id: None, wanted: None) -> Any:
        (out,) = outcomes
        return {
            "model": model, "version": version, "decision": out.decision, "confidence": out.confidence,
            "source": out.source, "lowConfidence": out.flagged, "fallbackReason": out.fallback_reason,
            "rule": out.rule, "trajectory": out.trajectory, "traceId": trace.trace_id,
        }

    @_boundary
    async def infer(request: Request) -> Response:
        started = arrived(request.scope)
        if (err := check_model(request)) is not None:
            return err
        return await serve(request, started, read_infer, answer_infer)

    @_boundary
    async def decisions(request: Request) -> Response:
        return await serve(request, arrived(request.scope), read_decision, answer_decision)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(_: Request, exc: HTTPException) -> Response:
        return _error(exc.status_code, exc.detail if isinstance(exc.detail, str) else "error",
                      getattr(exc, "headers", None))

    async def internal_error(_: Request, exc: Exception) -> Response:
        log.exception("internal error: %s", type(exc).__name__)
        return _error(503, f"the decision server could not answer ({type(exc).__name__}); retry")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await rt.start()
        try:
            yield
        finally:
            await rt.stop()

    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2", server_meta, methods=["GET"]),
        Route("/v2/models/{name}", model_meta, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}", model_meta, methods=["GET"]),
        Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/v1/decisions", decisions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/metrics/vllm", vllm_metrics.endpoint(rt.upstream_root), methods=["GET"]),
    ]
    # Bearer tokens checked by the cluster when ARBITER_AUTH is true (auth.py); None (a no-op) when it is off.
    middleware = [Middleware(AuthMiddleware, authenticator=authenticator_from_env(rt.options.env))]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error,  # type: ignore[dict-item]  # dispatched by class
                                        Exception: internal_error})
    app.state.runtime = rt
    return app

