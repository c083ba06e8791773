"""The audit writer against a real pipe: a reader that never drains it, one that drains it slowly, and the count of
what did not get through by the shutdown deadline."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import pytest
from arbiter_runtime.audit import AuditLog, StdoutSink
from arbiter_runtime.supervisor import shutdown_grace_s
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.runtime_helpers import ListSink


@pytest.fixture
def pipe():
    r, w = os.pipe()
    writer = os.fdopen(w, "w")
    yield r, writer
    writer.close()
    os.close(r)


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def _record(n: int, size: int = 700) -> dict:
    return {"kind": "arbiter.decision", "n": n, "pad": "x" * size}


def test_a_never_drained_stdout_is_given_up_at_the_deadline_and_counted(pipe, caplog):
    r, writer = pipe
    other = ListSink()
    audit = AuditLog([StdoutSink(writer), other])
    for n in range(300):  # ~210 KB into a 64 KiB pipe nobody reads
        audit.record(_record(n), reserved=False)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="arbiter.audit"):
        lost = asyncio.run(audit.close(time.monotonic() + 0.5))
    assert time.monotonic() - started < 1.5  # bounded by the deadline, not by the reader
    complete = _drain(r).count(b"\n")
    assert 0 < complete < 300
    assert lost == {"stdout": 300 - complete, "ListSink": 0}
    assert f"audit records not written at shutdown: stdout {300 - complete}, ListSink 0 (of 300 recorded)" in \
        caplog.text
    assert len(other.lines) == 300  # the stalled stdout never held up the other sink


def test_the_queue_depth_follows_the_slowest_sink_and_refuses_past_capacity(pipe):
    r, writer = pipe
    other = ListSink()
    audit = AuditLog([StdoutSink(writer), other], capacity=40)
    taken = 0
    while audit.reserve(1):
        audit.record(_record(taken, 10_000))
        taken += 1
        assert taken < 100, "the reservations never ran out"
    assert audit.depth == 40 and 40 <= taken < 60  # the pipe took a few, then stdout stalled
    assert audit.wait_written(0.2) is False
    assert len(other.lines) == taken
    _drain(r)
    os.set_blocking(r, True)
    reader = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(r, 1 << 16), b"")])
    reader.start()  # the reader comes back: stdout catches up, and the slots are free again
    assert audit.wait_written(10) and audit.depth == 0 and audit.reserve(1)
    writer.close()
    reader.join(5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=20),
       text=st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=8),
       pause=st.sampled_from([0.0, 0.0005]), read_size=st.sampled_from([1000, 4096, 1 << 16]))
def test_a_slow_reader_gets_every_line_whole_and_in_order(sizes, text, pause, read_size):
    """Lines above PIPE_BUF are written in pieces as the pipe takes them; the reader sees exactly the lines."""
    r, w = os.pipe()
    got = bytearray()

    def read() -> None:
        while chunk := os.read(r, read_size):
            got.extend(chunk)
            time.sleep(pause)

    reader = threading.Thread(target=read)
    reader.start()
    records = [{"n": n, "pad": (text or "é") * (size // max(1, len(text or "é")))} for n, size in enumerate(sizes)]
    with os.fdopen(w, "w") as writer:
        audit = AuditLog([StdoutSink(writer)])
        for record in records:
            audit.record(record, reserved=False)
        assert asyncio.run(audit.close(time.monotonic() + 30)) == {"stdout": 0}
    reader.join(30)
    os.close(r)
    from arbiter_runtime.jsonutil import dumps

    assert bytes(got) == b"".join(dumps(rec).encode() + b"\n" for rec in records)


def test_a_sink_that_fails_counts_its_records_and_the_others_get_them(caplog):
    class Broken(ListSink):
        name = "broken"

        def write(self, line: str) -> None:
            if '"n":1' in line:
                raise OSError("disk gone")
            super().write(line)

    errors: list[str] = []
    good, broken = ListSink(), Broken()
    audit = AuditLog([good, broken], on_write_error=errors.append)
    for n in range(3):
        audit.record({"n": n}, reserved=False)
    with caplog.at_level(logging.ERROR, logger="arbiter.audit"):
        assert asyncio.run(audit.close(time.monotonic() + 5)) == {"ListSink": 0, "broken": 1}
    assert len(good.lines) == 3 and len(broken.lines) == 2 and errors == ["Broken"]
    assert "broken 1 (of 3 recorded)" in caplog.text


def test_the_shutdown_grace_is_read_from_the_environment():
    assert shutdown_grace_s({}) == 25.0 < 30  # below Kubernetes' default terminationGracePeriodSeconds
    assert shutdown_grace_s({"ARBITER_SHUTDOWN_GRACE_S": "8.5"}) == 8.5
    for bad in ("0", "-3", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match="ARBITER_SHUTDOWN_GRACE_S"):
            shutdown_grace_s({"ARBITER_SHUTDOWN_GRACE_S": bad})
