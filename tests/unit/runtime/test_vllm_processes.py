"""The CPU of vLLM's processes on the decision server's /metrics, read from real processes that carry vLLM's titles.

Each tree is a real process tree: a root (`vllm serve`) and children started with vLLM's titles as their argv[0]
(what setproctitle leaves in /proc/<pid>/cmdline), some of them spending CPU on purpose.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from arbiter_runtime import vllm_processes
from arbiter_runtime.vllm_processes import cpu_seconds, register, role
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


@pytest.mark.parametrize(("title", "named"), [
    ("VLLM::APIServer_0", ("api-server", "0")),
    ("VLLM::APIServer_12" + " " * 40, ("api-server", "12")),  # setproctitle pads the old argv with spaces
    ("VLLM::EngineCore", ("engine-core", "0")),
    ("VLLM::EngineCore_DP1", ("engine-core", "DP1")),
    ("VLLM::Worker_TP1", ("worker", "TP1")),
    ("MYPREFIX::Worker", ("worker", "0")),  # VLLM_PROCESS_NAME_PREFIX may be changed
    ("/usr/bin/python3 -m vllm.entrypoints.cli.main serve /mnt/models", None),
    ("VLLM::DPCoordinator", None),
    ("VLLM::APIServerX", None),
    ("VLLM::APIServer_", None),
    ("VLLM::Worker_TP0\x00\x00", ("worker", "TP0")),
    ("VLLM::Worker_TP{0}", None),
    ("", None),
])
def test_vllm_titles_name_the_process(title, named):
    assert role(title) == named


def _tree(children: list[tuple[str, float]], root_burn_s: float) -> subprocess.Popen[str]:
    """A root that starts children titled as vLLM titles them, each spending its CPU seconds, then spends its own,
    prints "ready" once every child has spent its share, and waits for stdin to close."""
    code = textwrap.dedent(f"""
        import subprocess, sys
        kids = [subprocess.Popen([title, "-c", {BURN!r}.format(s=s) + "import sys; sys.stdin.read()"],
                                 executable=sys.executable, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for title, s in {children!r}]
        exec({BURN!r}.format(s={root_burn_s}))
        import os, time
        def spent(pid):
            with open(f"/proc/{{pid}}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        while any(spent(k.pid) < s * 0.9 for k, (_, s) in zip(kids, {children!r})):
            time.sleep(0.02)
        print("ready", flush=True)
        sys.stdin.read()
        for k in kids:
            k.stdin.close()
            k.wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@given(st.text())
def test_any_title_is_named_or_left_out_never_an_error(title):
    named = role(title)
    assert named is None or (named[0] in {"api-server", "engine-core", "worker"} and named[1].isascii()
                             and named[1].isalnum())


def _samples(registry: CollectorRegistry) -> list[dict[str, str]]:
    """The label sets of the family's samples, as a scraper parses the page."""
    page = generate_latest(registry).decode()
    return [dict(sample.labels) for family in text_string_to_metric_families(page)
            if family.name == vllm_processes.NAME for sample in family.samples]


@pytest.fixture
def trees():
    started: list[subprocess.Popen[str]] = []

    def start(children: list[tuple[str, float]], root_burn_s: float = 0.0) -> int:
        started.append(_tree(children, root_burn_s))
        return started[-1].pid

    yield start
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_one_api_server_is_the_root_and_its_busy_core_shows(trees):
    pid = trees([("VLLM::EngineCore", 0.1)], root_burn_s=0.6)
    seen = cpu_seconds(pid)
    assert set(seen) == {("api-server", "0"), ("engine-core", "0")}
    assert seen[("api-server", "0")] >= 0.5  # the root's own time, not its children's
    assert 0.05 <= seen[("engine-core", "0")] < 0.5


def test_with_several_api_servers_the_launcher_is_none_of_them(trees):
    pid = trees([("VLLM::APIServer_0", 0.4), ("VLLM::APIServer_1", 0.05), ("VLLM::EngineCore", 0.05)],
                root_burn_s=0.5)
    seen = cpu_seconds(pid)
    assert set(seen) == {("api-server", "0"), ("api-server", "1"), ("engine-core", "0")}
    assert 0.35 <= seen[("api-server", "0")] < 0.8  # APIServer_0 alone: the launcher's 0.5 s is not added
    assert seen[("api-server", "1")] < 0.35


def test_the_metrics_page_carries_one_counter_per_process(trees):
    pid = trees([("VLLM::APIServer_0", 0.0), ("VLLM::APIServer_1", 0.0), ("VLLM::EngineCore", 0.0),
                 ("VLLM::Worker_TP0", 0.0), ("VLLM::Worker_TP1", 0.0)])
    registry = CollectorRegistry()
    assert register(registry, "credit-limit", "1.0.0", {vllm_processes.PID_ENV: str(pid)})
    samples = _samples(registry)
    assert [(x["process"], x["index"]) for x in samples] == [
        ("api-server", "0"), ("api-server", "1"), ("engine-core", "0"), ("worker", "TP0"), ("worker", "TP1")]
    assert all(x["model"] == "credit-limit" and x["version"] == "1.0.0" for x in samples)


def test_vllm_gone_leaves_the_family_empty_and_the_page_whole():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    registry = CollectorRegistry()
    assert register(registry, "m", "v", {vllm_processes.PID_ENV: str(proc.pid)})
    page = generate_latest(registry).decode()
    assert f"# TYPE {vllm_processes.NAME}_total counter" in page
    assert _samples(registry) == []


@pytest.mark.parametrize("env", [{}, {vllm_processes.PID_ENV: ""}, {vllm_processes.PID_ENV: "abc"},
                                 {vllm_processes.PID_ENV: "1"}, {vllm_processes.PID_ENV: "-5"},
                                 {vllm_processes.PID_ENV: "\u00b2"}])
def test_without_a_vllm_of_its_own_nothing_is_registered(env):
    registry = CollectorRegistry()
    assert not register(registry, "m", "v", env)
    assert vllm_processes.NAME not in generate_latest(registry).decode()
