"""`python -m arbiter_runtime serve|supervise|worker ...` (also the `arbiter-runtime` script)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from types import FrameType
from typing import Any

from .config import ConfigError, load_config

EXIT_AUDIT_LOST = 4  # serve: some audit record is missing from some sink; the log says how many per sink


def _fast(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arbiter-runtime serve", description="Run the decision server")
    p.add_argument("--config", default=os.environ.get("ARBITER_DECISION_CONFIG"),
                   help="decision.json (default: $ARBITER_DECISION_CONFIG)")
    p.add_argument("--host", default=os.environ.get("ARBITER_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(os.environ.get("ARBITER_PORT", "8080")))
    p.add_argument("--model-dir", default=os.environ.get("ARBITER_MODEL_DIR") or None,
                   help="model directory with tokenizer.json (default: ask the upstream's /tokenize)")
    p.add_argument("--upstream", action="append", default=None,
                   help="OpenAI-compatible base URL, overriding upstream.url of the config (default: "
                        "$ARBITER_UPSTREAM_URL); once per engine when the pod runs several vLLM engines")
    return p


def _app(args: argparse.Namespace) -> tuple[Any, Any] | int:
    """(the app, the edge's limits), or the exit code of a setting that cannot run: 2 a bad config, 3 a tokenizer
    that cannot serve scored mode."""
    import asyncio
    import dataclasses

    from .edge import EdgeConfigError, EdgeLimits
    from .routing import routing_path_for
    from .server import create_app
    from .service import RuntimeOptions, resolve_from_model_dir
    from .shadow import shadow_path_for
    from .tokens import TokenizerRefused

    try:
        limits = EdgeLimits.from_env(os.environ)
        cfg = load_config(args.config)
        upstreams = [u.rstrip("/") for u in args.upstream or [os.environ.get("ARBITER_UPSTREAM_URL", "")] if u]
        if upstreams:
            cfg = dataclasses.replace(cfg, upstream=dataclasses.replace(
                cfg.upstream, url=upstreams[0], engines=tuple(upstreams) if len(upstreams) > 1 else ()))
        options = RuntimeOptions(model_dir=args.model_dir, shadow_config=shadow_path_for(args.config),
                                 routing_config=routing_path_for(args.config))
        app = create_app(cfg, options)
    except (ConfigError, EdgeConfigError, ValueError) as exc:
        print(f"arbiter-runtime: {exc}", file=sys.stderr)
        return 2
    if cfg.trajectory_mode == "scored" and args.model_dir:
        try:
            options.tokens = asyncio.run(resolve_from_model_dir(cfg, args.model_dir))
        except TokenizerRefused as exc:
            print(f"arbiter-runtime: {exc}", file=sys.stderr)
            return 3
    return app, limits


def _server(app: Any, limits: Any, args: argparse.Namespace) -> Any:
    """uvicorn with the edge's limits, whose signals start the runtime's shutdown clock."""
    import uvicorn

    from .edge import guarded_protocol, raise_fd_limit
    from .upstream import UPSTREAM_MAX_CONNECTIONS

    rt = app.state.runtime
    # The edge's limits (edge.py) live in uvicorn's httptools protocol: read deadlines, the head's size, a
    # connection cap below the descriptor limit, which is first lifted to the hard limit.
    raise_fd_limit()
    protocol = guarded_protocol(limits, reserved_fds=UPSTREAM_MAX_CONNECTIONS)
    logging.getLogger("arbiter.runtime").info(
        "edge: request head within %g s and %d bytes, body within %g s, at most %d connections",
        limits.header_timeout_s, limits.max_header_bytes, limits.body_timeout_s, protocol.cap)
    # Requests in flight get half the grace period; the audit flush has until its end (Runtime.stop).
    config = uvicorn.Config(app, host=args.host, port=args.port, lifespan="on", access_log=False,
                            log_level="info", timeout_graceful_shutdown=max(1, int(rt.shutdown_grace_s / 2)),
                            loop="uvloop" if _fast("uvloop") else "asyncio", http=protocol, ws="none")
    server = uvicorn.Server(config)
    handle_exit = server.handle_exit

    def on_signal(sig: int, frame: FrameType | None) -> None:
        # The shutdown's deadline counts from the first signal (Runtime.stop).
        rt.stop_requested_at = rt.stop_requested_at or time.monotonic()
        handle_exit(sig, frame)

    server.handle_exit = on_signal  # type: ignore[method-assign]  # uvicorn installs it as the signal handler
    rt.options.on_fatal = lambda _msg: setattr(server, "should_exit", True)
    return server


def serve(argv: list[str]) -> int:
    args = _serve_parser().parse_args(argv)
    built = _app(args)
    if isinstance(built, int):
        return built
    app, limits = built
    rt = app.state.runtime
    server = _server(app, limits, args)
    # uvicorn re-raises the signal it shut down on once it is done, with the handler that was there before it:
    # make that one a no-op, so a clean SIGTERM/SIGINT shutdown exits 0 (not 143), as the supervisor expects.
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if rt.fatal or not server.started:
        return 3
    if rt.audit_lost is None:  # a forced exit (a second Ctrl-C) or an error skipped the audit's close
        logging.getLogger("arbiter.audit").error("audit not closed: the shutdown did not run to its end")
        return EXIT_AUDIT_LOST
    return EXIT_AUDIT_LOST if any(rt.audit_lost.values()) else 0


COMMANDS = ("serve", "supervise", "worker", "after")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv and argv[0] in ("-h", "--help"):
        print("usage: arbiter-runtime {serve|supervise|worker} [options]  (each takes --help)\n"
              "       arbiter-runtime VLLM_SERVE_ARGS...   (= supervise -- VLLM_SERVE_ARGS: the container's form)")
        return 0
    if not argv or argv[0] not in COMMANDS:
        # The ServingRuntime's command is `arbiter-runtime` and KServe appends the `vllm serve` arguments.
        from .supervisor import main as supervise

        return supervise(["--", *argv] if argv else [])
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        return serve(rest)
    if cmd == "supervise":
        from .supervisor import main as supervise

        return supervise(rest)
    if cmd == "worker":
        from .supervisor import worker

        return worker(rest)
    if cmd == "after":
        from .supervisor import after

        return after(rest)
    print(f"arbiter-runtime: unknown command {cmd!r}; use serve, supervise or worker", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
