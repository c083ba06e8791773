"""CPU time of vLLM's processes, on the decision server's /metrics: which process bounds a pod's decisions/s.

    arbiter_vllm_process_cpu_seconds_total{model,version,engine,process,index}
        engine:  which of the pod's vLLM engines ("0" for the first or only one; spec.serving.vllm.engines)
        process: api-server (vLLM's OpenAI server: the `vllm serve` process itself, or each `VLLM::APIServer_N`
                 when spec.serving.vllm.apiServers > 1) | engine-core (`VLLM::EngineCore`, the scheduler) |
                 worker (`VLLM::Worker_TP<n>`, one per GPU at tensor parallel 2 and more)
        index:   the process's number in vLLM's own title (APIServer_3 -> "3", Worker_TP1 -> "TP1"), else "0"

Why: at concurrency 64 on one H100 a single API server process ran a whole core (0.99) while the GPU waited, and four
served 49% more decisions/s (docs/gpu.md, "API servers, the constraint and log-probabilities"). A process's rate
near 1.0 is the bound of its pod, and the alert ArbiterVLLMFrontendSaturated reads it. vLLM's own /metrics cannot
say it: with several API servers it serves prometheus_client's multiprocess registry, which has no process series.

The supervisor starts vLLM before the decision server and hands it vLLM's pid ($ARBITER_VLLM_PID; one per engine,
comma-separated, when the pod runs several); an engine's processes are that pid and its descendants, named by the
titles vLLM gives them (vllm/utils/system_utils.py set_process_title, a "VLLM::" prefix). Read with psutil at each
scrape (every 15-30 s): no thread, nothing kept between scrapes. psutil finds a tree's children by reading every
process's parent, so a read costs with the processes it can see: 2.5 ms for a tree of six among 140 processes on a
development machine (measured with `cpu_seconds` in a loop); a pod's own PID namespace holds about ten.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

PID_ENV = "ARBITER_VLLM_PID"
NAME = "arbiter_vllm_process_cpu_seconds"
# vLLM's titles (VLLM_PROCESS_NAME_PREFIX defaults to "VLLM") and the part each process plays.
TITLES = (("APIServer", "api-server"), ("EngineCore", "engine-core"), ("Worker", "worker"))


def role(title: str) -> tuple[str, str] | None:
    """(process, index) for a vLLM process title, or None for a process that is none of the three."""
    words = title.replace("\0", " ").split()
    head = words[0] if words else ""
    if "::" not in head:
        return None
    name = head.split("::", 1)[1]
    for prefix, process in TITLES:
        index = name[len(prefix) + 1:] if name.startswith(prefix + "_") else None
        if name == prefix or (index and index.isascii() and index.isalnum()):
            return process, index or "0"
    return None


def _title(proc: psutil.Process) -> str:
    # setproctitle rewrites argv in place: /proc/<pid>/cmdline reads as the title padded with spaces or NULs.
    return " ".join(proc.cmdline()).strip()


def cpu_seconds(root_pid: int) -> dict[tuple[str, str], float]:
    """(process, index) -> CPU seconds (user + system) of vLLM's processes under root_pid. The root is the API
    server unless it started `APIServer_N` processes (it then only launches and waits)."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {}
    read: list[tuple[psutil.Process, tuple[str, str] | None, float]] = []
    for proc in tree:
        try:
            times = proc.cpu_times()
            read.append((proc, role(_title(proc)), times.user + times.system))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # exited between the listing and the read
    launcher = any(named is not None and named[0] == "api-server" for _, named, _ in read)
    out: dict[tuple[str, str], float] = {}
    for proc, named, seconds in read:
        if named is None and proc is root and not launcher:
            named = ("api-server", "0")
        if named is not None:
            out[named] = out.get(named, 0.0) + seconds
    return out


class VLLMProcessCollector(Collector):
    def __init__(self, model: str, version: str, root_pids: tuple[int, ...]):
        self.labels = (model, version)
        self.root_pids = root_pids

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(NAME, "CPU time of vLLM's processes (user + system): a rate near 1 is a "
                                     "process that bounds the pod",
                                     labels=["model", "version", "engine", "process", "index"])
        for engine, pid in enumerate(self.root_pids):
            for (process, index), seconds in sorted(cpu_seconds(pid).items()):
                family.add_metric([*self.labels, str(engine), process, index], seconds)
        yield family


def root_pids(raw: str) -> tuple[int, ...] | None:
    """The engines' pids from $ARBITER_VLLM_PID ("123" or "123,456"), or None when it names none usable."""
    pids = raw.split(",") if raw else []
    if not pids or not all(p.isascii() and p.isdigit() and int(p) > 1 for p in pids):
        return None
    return tuple(int(p) for p in pids)


def register(registry: CollectorRegistry, model: str, version: str, env: dict[str, str] | None = None) -> bool:
    """Adds the collector when the supervisor named vLLM's pids; False (nothing added) when it did not: a decision
    server in front of another upstream has no vLLM processes of its own to read."""
    pids = root_pids((os.environ if env is None else env).get(PID_ENV, ""))
    if pids is None:
        return False
    registry.register(VLLMProcessCollector(model, version, pids))
    return True
