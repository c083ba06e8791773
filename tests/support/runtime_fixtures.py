"""Runtime fixtures: the stand-in upstream and the decision server, each a real HTTP server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv.vllm_standin import StandinServer
from arbiter_runtime.service import RuntimeOptions

from support.hostile_s3 import S3FaultProxy
from support.runtime_helpers import LABELS, RuntimeServer, base_config


@pytest.fixture
def standin() -> Iterator[StandinServer]:
    server = StandinServer(words=LABELS, served_model_name="credit-v1").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_runtime() -> Iterator[Any]:
    started: list[RuntimeServer] = []

    def make(raw_cfg: dict[str, Any], options: RuntimeOptions | None = None, wait_ready: bool = True,
             engines: tuple[str, ...] = ()):
        server = RuntimeServer(raw_cfg, options, engines)
        started.append(server)
        return server.start(wait_ready)

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def s3_proxy(s3_server: Any) -> Iterator[S3FaultProxy]:
    """The real S3 server behind S3FaultProxy: a test sets `fault` to make it answer what S3 answers at its worst."""
    peer = S3FaultProxy(s3_server.endpoint_url).start()
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture
def runtime(standin: StandinServer, make_runtime) -> RuntimeServer:
    return make_runtime(base_config(standin.url))


