"""What an audit sink is, and the stdout sink.

A sink takes one line at a time from its own writer thread (AuditLog), so it may block; at shutdown it is told the
deadline (`stop_by`) and `close(deadline)` answers how many of the records it took are not durably written.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Protocol, TextIO

# A write of at most PIPE_BUF bytes to a pipe that poll() calls writable does not block (POSIX: such writes are
# atomic, and Linux reports POLLOUT only while a whole buffer page is free).
_CHUNK = getattr(select, "PIPE_BUF", 512)
_POLL_SLICE_S = 0.1  # how often a blocked write looks at the deadline


class SinkStalled(Exception):
    """The shutdown deadline passed and the sink could not take the line."""


class Sink(Protocol):
    def write(self, line: str) -> None: ...

    async def close(self, deadline: float) -> int: ...


def sink_name(sink: object) -> str:
    return str(getattr(sink, "name", type(sink).__name__))


class StdoutSink:
    """One line per record on stdout (or `stream`), written straight to its file descriptor.

    Why not `sys.stdout.write`: a write to a pipe nobody drains blocks inside the kernel, and no other thread can
    end it; the shutdown would then wait for ever, or give up without knowing what was written. Here every chunk
    waits for poll() to say the descriptor can take it, in slices that look at the deadline (`stop_by`); past it
    the sink raises SinkStalled and AuditLog counts this line and the rest as not written. A stream without a
    descriptor (a StringIO in tests) is written to as a stream.
    """

    name = "stdout"

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream
        self._deadline: float | None = None
        self._poller: tuple[int, select.poll] | None = None

    def stop_by(self, deadline: float) -> None:
        self._deadline = deadline

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def write(self, line: str) -> None:
        if self._past_deadline():
            raise SinkStalled
        stream = self._stream or sys.stdout
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
            stream.write(line + "\n")
            stream.flush()
            return
        view = memoryview((line + "\n").encode())
        while view:
            self._wait_writable(fd)
            view = view[os.write(fd, view[:_CHUNK]):]

    def _wait_writable(self, fd: int) -> None:
        if self._poller is None or self._poller[0] != fd:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            self._poller = (fd, poller)
        poller = self._poller[1]
        while not poller.poll(_POLL_SLICE_S * 1000):
            if self._past_deadline():
                raise SinkStalled
        # POLLERR/POLLHUP (the reader is gone) also end the wait: os.write then raises, a write error

    async def close(self, deadline: float) -> int:
        return 0  # every line write() returned from is in the descriptor (or the stream, flushed) in full
