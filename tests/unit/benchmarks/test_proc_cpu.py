"""The GPU benchmark's CPU reading (benchmarks/gpu/proc_cpu.py): which process bounds a cell is read from it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"))

import proc_cpu


@pytest.mark.parametrize("cmdline, part", [
    ("VLLM::EngineCore", "vllm-engine"),
    ("VLLM::Worker_TP0", "vllm-engine"),
    ("VLLM::APIServer_3", "vllm-api"),
    ("python3 -m vllm.entrypoints.cli.main serve /mnt/models --port=8000", "vllm-api"),
    ("python3 -m arbiter_runtime supervise --config c.json -- /mnt/models", "runtime"),
    ("bash benchmarks/gpu/device_7b.sh frontend", None),
    ("", None),  # a zombie's empty command line
])
def test_each_process_is_named_by_the_part_it_plays(cmdline: str, part: str | None) -> None:
    assert proc_cpu.role(cmdline, me=1, pid=2) == part


def test_the_load_generator_is_itself() -> None:
    assert proc_cpu.role("VLLM::EngineCore", me=7, pid=7) == "loadgen"


def test_shares_per_part_count_only_processes_seen_before_and_after() -> None:
    before = {1: ("vllm-api", 10.0), 2: ("vllm-api", 3.0), 3: ("vllm-engine", 5.0), 9: ("runtime", 1.0)}
    after = {1: ("vllm-api", 19.5), 2: ("vllm-api", 4.0), 3: ("vllm-engine", 10.0),
             4: ("vllm-engine", 99.0)}  # pid 4 started during the cell; pid 9 ended: neither counts
    out = proc_cpu.shares(before, after, wall_s=10.0)
    assert out == {"vllm-api": {"cores": 1.05, "busiest": 0.95, "processes": 2},
                   "vllm-engine": {"cores": 0.5, "busiest": 0.5, "processes": 1}}
    assert proc_cpu.shares(before, after, wall_s=0.0) == {}


def test_a_busy_process_reads_as_about_one_core() -> None:
    before = proc_cpu.snapshot()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        pass
    out = proc_cpu.shares(before, proc_cpu.snapshot(), time.monotonic() - t0)
    # At least a fifth of a core even on a loaded machine; never more than the one core a single thread can run.
    assert 0.2 <= out["loadgen"]["busiest"] <= 1.1, out
