"""The decision server's network edge against hostile peers on real sockets: slow senders are cut off at their read
deadlines, a huge head gets 431, a full descriptor table still answers the liveness probe, a caller that leaves
mid-body is no error, and an upstream answer larger than its max_tokens allow is cut off with memory flat."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import threading
import time
import urllib.request

import pytest
from arbiter_devenv.vllm_standin import StandinServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.edge_kit import FloodUpstream, ServeProc
from support.runtime_procs import CODES, LABELS

HEADER_S, BODY_S = 1.0, 1.5
SHORT = {"ARBITER_HEADER_TIMEOUT_S": str(HEADER_S), "ARBITER_BODY_TIMEOUT_S": str(BODY_S)}
DOC = {"amount": 120, "country": "DE"}


@pytest.fixture(scope="module")
def standin():
    s = StandinServer(words=LABELS + CODES, served_model_name="credit-v1").start()
    yield s
    s.stop()


@pytest.fixture
def short_server(standin, tmp_path):
    s = ServeProc(tmp_path, standin.url, env=SHORT).start()
    yield s
    s.stop()


async def _slow(port: int, head: bytes, trickle: bytes, every_s: float) -> tuple[float, bytes]:
    """Send `head`, then `trickle` one byte every `every_s`; when the server answers or hangs up: (seconds since
    the connection opened, what it answered)."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def feed() -> None:
        writer.write(head)
        for byte in trickle:
            await asyncio.sleep(every_s)
            writer.write(bytes([byte]))
            await writer.drain()

    feeder = asyncio.create_task(feed())
    try:
        answer = await asyncio.wait_for(reader.read(4096), 30)
    except (TimeoutError, ConnectionError):
        answer = b""
    took = time.monotonic() - t0
    feeder.cancel()
    writer.close()
    return took, answer


async def _slowloris(port: int, n: int) -> list[tuple[str, float, bytes]]:
    heads = [("head", _slow(port, b"GET /v2/health/live HTTP/1.1\r\n", b"x-a: b\r\n" * 40, 0.2)) for _ in range(n)]
    body_head = (b"POST /v1/decisions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 100000\r\n\r\n")
    bodies = [("body", _slow(port, body_head, b" " * 100000, 0.2)) for _ in range(n)]
    done = await asyncio.gather(*(c for _, c in heads + bodies))
    return [(kind, took, answer) for (kind, _), (took, answer) in zip(heads + bodies, done, strict=True)]


def test_slow_heads_and_bodies_are_closed_at_their_read_deadlines(short_server):
    results = asyncio.run(_slowloris(short_server.port, 25))
    slack = 1.0  # the sweep runs every tenth of a deadline; the rest is a busy machine
    for kind, took, answer in results:
        limit = HEADER_S if kind == "head" else HEADER_S + BODY_S
        assert took < limit + slack, (kind, took)
        assert answer.startswith(b"HTTP/1.1 408 "), (kind, answer[:80])
    heads = [took for kind, took, _ in results if kind == "head"]
    assert min(heads) >= HEADER_S - 0.05  # not before: a slow but honest client gets its full deadline
    assert short_server.decide(DOC)[0] == 200  # and the server still decides
    assert "ERROR" not in short_server.log()


def _send_all(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the server stopped reading and closed: expected for a head it refuses


def test_a_one_mib_head_gets_431_without_being_read_whole(short_server):
    before = short_server.peak_rss_kib()
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", short_server.port), timeout=10)
        head = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (1 << 20) + b"\r\n\r\n"
        sender = threading.Thread(target=_send_all, args=(sock, head))
        sender.start()
        answer = sock.recv(4096)
        sender.join(10)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert short_server.peak_rss_kib() - before < 8 * 1024
    # A large but allowed head (the default limit is 32 KiB) is still served.
    sock = socket.create_connection(("127.0.0.1", short_server.port), timeout=10)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 20000 + b"\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
    sock.close()


def test_liveness_is_answered_with_1100_idle_connections_under_nofile_1024(standin, tmp_path):
    server = ServeProc(tmp_path, standin.url, nofile=1024,
                       env={"ARBITER_HEADER_TIMEOUT_S": "120", "ARBITER_BODY_TIMEOUT_S": "120"}).start()
    idle: list[socket.socket] = []
    try:
        for _ in range(1100):  # each sends nothing; the kernel accepts them all into the backlog
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        time.sleep(1.0)  # the server has taken them all off the backlog
        for _ in range(3):
            t0 = time.monotonic()
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 "), "liveness not answered"
            assert time.monotonic() - t0 < 2.0
            sock.close()
        assert server.decide(DOC)[0] == 200
        log = server.log()
        assert "Too many open files" not in log and "ERROR" not in log, log[-2000:]
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_a_caller_leaving_mid_body_is_not_an_error(short_server):
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", short_server.port), timeout=5)
        sock.sendall(b"POST /v1/decisions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 1000\r\n\r\n{\"amount\": 1")
        time.sleep(0.05)
        sock.close()
    time.sleep(0.5)
    assert short_server.decide(DOC)[0] == 200
    log = short_server.log()
    assert "ERROR" not in log and "Traceback" not in log, log[-2000:]


@pytest.mark.parametrize("mode", ["padded", "chunked"])
def test_an_upstream_answer_over_its_bound_falls_back_with_memory_flat(standin, tmp_path, mode):
    flood = FloodUpstream(standin.url).start()
    server = ServeProc(tmp_path, flood.url, deadlineMs=30000).start()
    try:
        assert server.decide(DOC)[1]["source"] == "model"  # warm: the same path, an honest answer
        before = server.peak_rss_kib()
        flood.mode = mode
        for _ in range(3):
            t0 = time.monotonic()
            status, body = server.decide(DOC)
            assert status == 200 and body["source"] == "rules", body
            assert body["fallbackReason"] == "upstream_error"
            assert time.monotonic() - t0 < 5  # cut at the bound, not at the 30 s deadline
        grown_mib = (server.peak_rss_kib() - before) / 1024
        assert grown_mib < 16, f"peak RSS grew {grown_mib:.0f} MiB"
        assert flood.sent < 3 * 64 * (1 << 20)  # it stopped reading: the flood did not all go through
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        assert re.search(r'arbiter_upstream_errors_total\{[^}]*kind="too_large"[^}]*\} 3\.0', metrics), metrics
    finally:
        server.stop()
        flood.stop()


def test_a_body_refused_early_is_answered_413_once(short_server):
    """A declared body over the 8 MiB limit is refused before it arrives; the bytes still coming are neither
    counted as a request head (no 431) nor answered a second time when the body deadline passes."""
    sock = socket.create_connection(("127.0.0.1", short_server.port), timeout=10)
    sock.sendall(b"POST /v1/decisions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 9437184\r\n\r\n" + b" " * 200_000)
    got = b""
    t_end = time.monotonic() + BODY_S + 3
    while time.monotonic() < t_end:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    sock.close()
    assert got.startswith(b"HTTP/1.1 413 "), got[:200]
    assert got.count(b"HTTP/1.1 ") == 1, got[:400]


@pytest.fixture(scope="module")
def edge_server(standin, tmp_path_factory):
    s = ServeProc(tmp_path_factory.mktemp("edge"), standin.url, env=SHORT).start()
    yield s
    s.stop()


LIMIT = 32 * 1024  # ARBITER_MAX_HEADER_BYTES' default


@settings(deadline=None, database=None, max_examples=60, suppress_health_check=list(HealthCheck))
@given(pad=st.one_of(st.integers(0, LIMIT - 1024), st.integers(LIMIT + 1, 4 * LIMIT)),
       cuts=st.lists(st.floats(0, 1), max_size=6), pause=st.floats(0, 0.05))
def test_a_head_is_answered_or_refused_by_its_size_however_it_is_split(edge_server, pad, cuts, pause):
    """Any split of the head into reads, slow or fast (within the deadline): a head within the limit is served, one
    over it gets 431; the accounting does not depend on where the reads fall."""
    head = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-pad: " + b"p" * pad + b"\r\n\r\n"
    points = sorted({int(c * len(head)) for c in cuts} | {0, len(head)})
    sock = socket.create_connection(("127.0.0.1", edge_server.port), timeout=10)
    try:
        for a, b in itertools.pairwise(points):
            try:
                sock.sendall(head[a:b])
            except OSError:
                break  # refused and closed before the whole head was sent
            time.sleep(pause)
        answer = sock.recv(4096)
    finally:
        sock.close()
    want = b"HTTP/1.1 200 " if pad <= LIMIT - 1024 else b"HTTP/1.1 431 "
    assert answer.startswith(want), (pad, points, answer[:100])
