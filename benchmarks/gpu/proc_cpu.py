"""CPU time of the processes that serve a decision, read from /proc before and after a benchmark cell.

What it answers: whether one process (vLLM's API server, its engine core, the decision server, the load generator)
runs a whole core while the GPU waits; a process near 1.0 cores is the bound of its cell. Processes are grouped by
what their command line says they are (vLLM names its processes `VLLM::EngineCore`, `VLLM::APIServer_N`).
"""

from __future__ import annotations

import os
from pathlib import Path

from arbiter_runtime.vllm_processes import role as vllm_role

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def role(cmdline: str, me: int, pid: int) -> str | None:
    """The part a process plays in a cell, or None for a process that plays none. vLLM's titles are read as the
    decision server reads them for its own metrics (arbiter_runtime.vllm_processes.role)."""
    if pid == me:
        return "loadgen"
    titled = vllm_role(cmdline)
    if titled is not None:
        return "vllm-api" if titled[0] == "api-server" else "vllm-engine"
    if "vllm.entrypoints" in cmdline or "vllm serve" in cmdline:
        return "vllm-api"
    if "arbiter_runtime" in cmdline:
        return "runtime"
    return None


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for every process that plays a part."""
    me = os.getpid()
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        part = role(cmdline, me, int(entry.name))
        if part is not None:
            out[int(entry.name)] = (part, (int(fields[11]) + int(fields[12])) / _TICK)  # utime + stime
    return out


def shares(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float) -> dict:
    """Per role: cores used in all, the busiest process's cores, and how many processes ran."""
    out: dict[str, dict] = {}
    if wall_s <= 0:
        return out
    for pid, (part, cpu) in after.items():
        if pid not in before:  # started during the cell: its CPU time is not the cell's alone
            continue
        used = (cpu - before[pid][1]) / wall_s
        row = out.setdefault(part, {"cores": 0.0, "busiest": 0.0, "processes": 0})
        row["cores"] += used
        row["busiest"] = max(row["busiest"], used)
        row["processes"] += 1
    return {k: {"cores": round(v["cores"], 2), "busiest": round(v["busiest"], 2), "processes": v["processes"]}
            for k, v in sorted(out.items())}
