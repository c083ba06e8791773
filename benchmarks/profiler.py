"""py-spy on the operator process: where its CPU goes (scale.py --profile)."""

from __future__ import annotations

import pathlib
import re
import sys
from collections import Counter


class Profiler:
    """py-spy sampling the operator process (all threads, idle frames left out) into collapsed stacks; `top()` sums
    them by function, inclusive, so the summary names where the operator's CPU goes."""

    def __init__(self, pid: int, path: pathlib.Path, rate: int = 50, gil: bool = False):
        """gil: sample only the thread holding the GIL (py-spy --gil): Python's CPU, without the threads that wait
        for an answer or for the GIL itself, which py-spy --nonblocking cannot always tell from work."""
        import shutil
        import subprocess

        exe = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
        self.path = path
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
                                      "--output", str(path), "--nonblocking", *(["--gil"] if gil else [])],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except Exception:
            self.proc.kill()

    def top(self, n: int = 25) -> list[tuple[str, float]]:
        """Inclusive share of the busy samples per function. A sample whose innermost frame waits (select, a socket
        read, a lock, a sleep) is idle, whatever py-spy's own guess: it is left out, so the shares add up CPU."""
        return self._tally(n)[0]

    def top_self(self, n: int = 25) -> list[tuple[str, float]]:
        """Self share of the busy samples per function (the innermost frame): where the CPU is burnt."""
        return self._tally(n)[1]

    def busy_share(self) -> float:
        return self._tally(1)[2]

    def _tally(self, n: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]], float]:
        if not self.path.exists():
            return [], [], 0.0
        total = busy = 0
        incl: Counter[str] = Counter()
        own: Counter[str] = Counter()
        for line in self.path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            k = int(count)
            total += k
            frames = [re.sub(r":\d+\)$", ")", re.sub(r" \(.*?/(site-packages|arbiter_operator)/", " (", f))
                      for f in stack.split(";")]
            if not frames or _WAITING.search(frames[-1]):
                continue
            busy += k
            own[frames[-1]] += k
            for f in set(frames):
                incl[f] += k
        if not busy:
            return [], [], 0.0

        def share(c: Counter[str]) -> list[tuple[str, float]]:
            return [(f, 100.0 * k / busy) for f, k in c.most_common(n)]

        return share(incl), share(own), 100.0 * busy / total


# Innermost frames that wait rather than compute (py-spy cannot always tell with --nonblocking).
_WAITING = re.compile(r"^(select|poll|_poll|wait|acquire|sleep|readinto|recv|recv_into|read|accept"
                      r"|_wait_for_tstate_lock|epoll|EpollSelector\.select|SocketIO\.readinto|Condition\.wait|Event\.wait|"
                      r"_SSLSocket\.read|SSLSocket\.read|SSLSocket\.recv_into|Thread\.join|Queue\.get) \(")
