"""The decision server's HTTP surface: KServe V2 REST + POST /v1/decisions + /metrics, one code path per decision.
The state behind it (start-up, readiness, deciding rows, shutdown) is service.py's Runtime."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import __version__, vllm_metrics
from .audit import Trace, trace_from_header
from .auth import AuthMiddleware, authenticator_from_env, current_caller
from .config import DecisionConfig
from .decide import Outcome
from .edge import arrived
from .inputs import BodyTooLarge, UnsupportedMediaType, read_json, read_limited
from .jsonutil import dumps_bytes
from .protocol import OUTPUT_METADATA, BadRequest, Outputs, infer_response, parse_infer, wants_json_readiness
from .service import Runtime, RuntimeOptions
from .shadow import SHADOW_HEADER
from .tensor_binary import HEADER_LENGTH, attach_inputs, encode_outputs

log = logging.getLogger("arbiter.runtime")

Handler = Callable[[Request], Awaitable[Response]]


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


class _Meta:
    """Health and metadata: what a KServe client (and the kubelet's probes) ask before they send a decision."""

    def __init__(self, rt: Runtime, cfg: DecisionConfig):
        self.rt, self.cfg = rt, cfg

    def unknown(self, request: Request) -> JSONResponse | None:
        """404 naming what this server serves when the path names another model or version."""
        name, v = request.path_params["name"], request.path_params.get("version")
        model, version = self.cfg.model, self.cfg.version
        if name != model:
            return _error(404, f"unknown model {name!r}; this server serves {model!r}")
        if v is not None and v != version:
            return _error(404, f"unknown version {v!r} of model {model!r}; this server serves version {version!r}")
        return None

    async def live(self, _: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        vary = {"vary": "accept"}  # the unready answer depends on Accept: a cache must not mix them
        if self.rt.ready:
            return JSONResponse({"ready": True}, headers=vary)
        status = 200 if wants_json_readiness(request.headers.get("accept")) else 503
        return JSONResponse({"ready": False, "error": self.rt.not_ready_reason}, status_code=status, headers=vary)

    async def server(self, _: Request) -> Response:
        return JSONResponse({"name": "arbiter-runtime", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def model(self, request: Request) -> Response:
        if (err := self.unknown(request)) is not None:
            return err
        cfg = self.cfg
        return JSONResponse({
            "name": cfg.model, "versions": [cfg.version], "platform": "arbiter-vllm",
            "inputs": [{"name": "input", "datatype": "BYTES", "shape": [-1]}],
            "outputs": OUTPUT_METADATA,
            "parameters": {"labels": list(cfg.labels), "reasoningCodes": list(cfg.reasoning_codes),
                           "steps": cfg.steps, "trajectoryMode": cfg.trajectory_mode},
        })

    async def model_ready(self, request: Request) -> Response:
        if (err := self.unknown(request)) is not None:
            return err
        if self.rt.ready:
            return JSONResponse({"name": self.cfg.model, "ready": True})
        return JSONResponse({"name": self.cfg.model, "ready": False, "error": self.rt.not_ready_reason},
                            status_code=503)

    async def metrics(self, _: Request) -> Response:
        return Response(generate_latest(self.rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)


class _Decisions:
    """The decision path both endpoints share (V2 infer and /v1/decisions): route, admit, read, decide, audit,
    answer, mirror."""

    def __init__(self, rt: Runtime, cfg: DecisionConfig, meta: _Meta):
        self.rt, self.cfg, self.meta = rt, cfg, meta

    def admit(self, headers: dict[str, str]) -> JSONResponse | None:
        if not self.rt.loaded:
            return _error(503, f"model {self.cfg.model} is not ready: {self.rt.not_ready_reason}", headers)
        return None

    async def decide_audited(self, documents: list[Any], trace: Trace, started: float, req_id: str | None,
                             headers: dict[str, str], shadow: bool) -> tuple[list[Outcome], list[str]] | JSONResponse:
        """Decide the rows and write the audit records of exactly the rows whose answer leaves the server:
        every row of a 200; on a 503 for want of a decision, the rows that had none (their error leaves).
        Returns the outcomes and the rows' canonical JSON."""
        rt = self.rt
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

    async def routed(self, request: Request, route: Any) -> Response:
        """A context pinned to another version: that version decides (routing.py); its answer goes back as it is."""
        body = await read_limited(request.headers, request.stream())
        # The caller's identity goes with the request as its bearer token (or nothing is checked: auth off).
        identity_passes = "authorization" in request.headers or current_caller() is None
        out = await self.rt.routing.forward(route, request.url.path, request.headers, body, identity_passes)
        return Response(out.body, status_code=out.status, headers=out.headers)

    async def serve(self, request: Request, started: float, read: Any, answer: Any) -> Response:
        """A context pinned to another version goes there; otherwise admit, read the rows (`read`: request ->
        documents, request id, what the answer needs), decide and audit, answer (`answer`: outcomes, trace, request
        id, that -> body), mirror to the candidate (never a mirrored request itself: no loops)."""
        rt = self.rt
        if rt.routing.routes and (route := rt.routing.match(request.headers)) is not None:
            return await self.routed(request, route)
        trace = trace_from_header(request.headers.get("traceparent"))
        headers = {"traceparent": trace.traceparent}
        if (err := self.admit(headers)) is not None:
            return err
        shadow = SHADOW_HEADER in request.headers
        try:
            documents, req_id, wanted = await read(request)
            result = await self.decide_audited(documents, trace, started, req_id, headers, shadow)
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

    @staticmethod
    async def read_infer(request: Request) -> tuple[list[Any], str | None, Outputs]:
        document, binary = await read_json(request.headers, request.stream(), framed=True)
        return parse_infer(attach_inputs(document, binary))

    def answer_infer(self, outcomes: list[Outcome], trace: Trace, req_id: str | None, wanted: Outputs) -> Any:
        params = {"trace_id": trace.trace_id, "traceparent": trace.traceparent}
        body = infer_response(self.cfg.model, self.cfg.version, req_id, outcomes, params, wanted)
        return encode_outputs(body, wanted.binary) if wanted.binary else body

    @staticmethod
    async def read_decision(request: Request) -> tuple[list[Any], None, None]:
        return [(await read_json(request.headers, request.stream()))[0]], None, None

    def answer_decision(self, outcomes: list[Outcome], trace: Trace, req_id: None, wanted: None) -> Any:
        (out,) = outcomes
        return {
            "model": self.cfg.model, "version": self.cfg.version, "decision": out.decision,
            "confidence": out.confidence, "source": out.source, "lowConfidence": out.flagged,
            "fallbackReason": out.fallback_reason, "rule": out.rule, "trajectory": out.trajectory,
            "traceId": trace.trace_id,
        }

    async def infer(self, request: Request) -> Response:
        started = arrived(request.scope)
        if (err := self.meta.unknown(request)) is not None:
            return err
        return await self.serve(request, started, self.read_infer, self.answer_infer)

    async def decisions(self, request: Request) -> Response:
        return await self.serve(request, arrived(request.scope), self.read_decision, self.answer_decision)


async def _http_error(_: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, exc.detail if isinstance(exc.detail, str) else "error",
                  getattr(exc, "headers", None))


async def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("internal error: %s", type(exc).__name__)
    return _error(503, f"the decision server could not answer ({type(exc).__name__}); retry")


def create_app(cfg: DecisionConfig, options: RuntimeOptions | None = None) -> Starlette:
    rt = Runtime(cfg, options or RuntimeOptions())
    meta = _Meta(rt, cfg)
    path = _Decisions(rt, cfg, meta)
    infer, decisions = _boundary(path.infer), _boundary(path.decisions)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await rt.start()
        try:
            yield
        finally:
            await rt.stop()

    routes = [
        Route("/v2/health/live", meta.live, methods=["GET"]),
        Route("/v2/health/ready", meta.ready, methods=["GET"]),
        Route("/v2", meta.server, methods=["GET"]),
        Route("/v2/models/{name}", meta.model, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}", meta.model, methods=["GET"]),
        Route("/v2/models/{name}/ready", meta.model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", meta.model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/v1/decisions", decisions, methods=["POST"]),
        Route("/metrics", meta.metrics, methods=["GET"]),
        Route("/metrics/vllm", vllm_metrics.endpoint(
            rt.upstream_roots, rt.options.env.get("ARBITER_AUTH_INFERENCESERVICE", "")), methods=["GET"]),
    ]
    # Bearer tokens checked by the cluster when ARBITER_AUTH is true (auth.py); None (a no-op) when it is off.
    middleware = [Middleware(AuthMiddleware, authenticator=authenticator_from_env(rt.options.env))]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: _http_error,  # type: ignore[dict-item]  # dispatched by class
                                        Exception: _internal_error})
    app.state.runtime = rt
    return app
