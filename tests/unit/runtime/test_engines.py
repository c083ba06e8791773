"""Several vLLM engines behind one decision server (spec.serving.vllm.engines): each request goes to the engine with
the fewest in flight, readiness needs every engine, and /metrics/vllm keeps the engines' series apart."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pytest
from arbiter_devenv.vllm_standin import StandinServer, free_port
from arbiter_runtime.service import RuntimeOptions
from arbiter_runtime.upstream import EnginePicker
from arbiter_runtime.vllm_metrics import merge_engines, only_vllm, scrape_all
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.http_stub import serving
from support.runtime_helpers import LABELS, base_config


@settings(max_examples=300, deadline=None)
@given(engines=st.integers(1, 8), ops=st.lists(st.one_of(st.just(None), st.integers(0, 7)), max_size=60))
def test_the_picked_engine_has_the_fewest_in_flight(engines, ops):
    """Any order of requests starting (None) and ending (an engine's number): the engine picked never has more in
    flight than another; an engine whose answers take longer keeps more and so gets fewer."""
    picker = EnginePicker(tuple(f"http://e{i}" for i in range(engines)))
    for op in ops:
        if op is None:
            chosen = picker.pick()
            assert picker.in_flight[chosen] == min(picker.in_flight)
            picker.in_flight[chosen] += 1
        elif op < engines and picker.in_flight[op] > 0:
            picker.in_flight[op] -= 1


@given(engines=st.integers(2, 8), rounds=st.integers(1, 20))
def test_idle_engines_take_requests_in_turn(engines, rounds):
    """Requests answered one at a time (nothing in flight at each pick) spread evenly: no engine stays idle."""
    picker = EnginePicker(tuple(f"http://e{i}" for i in range(engines)))
    picked = [picker.pick() for _ in range(engines * rounds)]
    assert all(picked.count(i) == rounds for i in range(engines))


@pytest.fixture
def two_standins():
    servers = [StandinServer(words=LABELS, served_model_name="credit-v1").start() for _ in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_decisions_spread_over_the_engines_and_their_metrics_stay_apart(make_runtime, two_standins):
    urls = tuple(s.url for s in two_standins)
    server = make_runtime(base_config(urls[0]), engines=urls)
    with server.client() as c, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: c.post("/v1/decisions", json={"amount": n, "country": "DE"}),
                                range(80)))
        page = c.get("/metrics/vllm")
    assert all(r.status_code == 200 and r.json()["source"] == "model" for r in answers)
    served = [s.state.completions for s in two_standins]
    assert sum(served) == 80 and min(served) >= 20, served  # both engines decided, neither was left idle
    assert page.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(page.text)}
    (requests,) = [f for name, f in families.items() if name == "vllm:request_success"]
    per_engine = {}
    for sample in requests.samples:
        if sample.name.endswith("_total"):
            per_engine[sample.labels["engine"]] = per_engine.get(sample.labels["engine"], 0) + sample.value
    assert per_engine == {"0": served[0], "1": served[1]}


def test_readiness_needs_every_engine(make_runtime, two_standins):
    urls = tuple(s.url for s in two_standins)
    two_standins[1].stop()
    server = make_runtime(base_config(urls[0]), RuntimeOptions(), wait_ready=False, engines=urls)
    time.sleep(1.0)
    # The engine that does not answer is named, the one that does is not.
    assert not server.runtime.ready
    assert server.runtime.not_ready_reason == f"waiting for the upstream at {urls[1].removesuffix('/v1')}"
    with server.client() as c:
        assert c.get("/v2/health/ready").status_code == 503


class _Page(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[dict[int, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        status, body = type(self).pages[self.server.server_address[1]]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_one_engine_without_metrics_is_a_503_that_names_it():
    with serving(_Page) as first, serving(_Page) as second:
        roots = (first, second)
        _Page.pages = {int(first.rsplit(":", 1)[1]): (200, b"vllm:x 1\n"),
                       int(second.rsplit(":", 1)[1]): (500, b"")}
        status, text = asyncio.run(scrape_all(roots))
    assert status == 503 and text.startswith("engine 1: ") and "500" in text


_value = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _page(draw):
    """A vLLM page: families of samples with hostile label values, with or without vLLM's own `engine` label."""
    lines = []
    for f in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["gauge", "counter"]))
        name = f"vllm:f{f}"
        lines += [f"# HELP {name} help of {f}", f"# TYPE {name} {kind}"]
        sample = name + ("_total" if kind == "counter" else "")
        for _ in range(draw(st.integers(1, 3))):
            labels = [f'model_name="{_esc(draw(_value))}"', f'other="{_esc(draw(_value))}"']
            if draw(st.booleans()):
                labels.append(f'engine="{_esc(draw(_value))}"')
            labels = draw(st.permutations(labels))
            lines.append(f"{sample}{{{','.join(labels)}}} {draw(st.integers(0, 10**6))}")
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None)
@given(pages=st.lists(_page(), min_size=2, max_size=4))
def test_merged_pages_parse_and_each_sample_names_its_engine(pages):
    """Prometheus' own parser reads the merged page; every sample of engine i says engine="i" (vLLM's own engine
    label, its data-parallel rank, gets the number) and keeps its other labels and value."""
    merged = merge_engines([only_vllm(p) for p in pages])
    got = sorted((s.name, s.labels["engine"], s.labels["model_name"], s.labels["other"], s.value)
                 for f in text_string_to_metric_families(merged) for s in f.samples)
    want = []
    for engine, page in enumerate(pages):
        for f in text_string_to_metric_families(page):
            want += [(s.name, str(engine), s.labels["model_name"], s.labels["other"], s.value) for s in f.samples]
    assert got == sorted(want)
    helps = [line for line in merged.splitlines() if line.startswith("# HELP ")]
    assert sorted(helps) == sorted({line for p in pages for line in p.splitlines() if line.startswith("# HELP ")})


def test_after_waits_for_the_engine_before_and_keeps_its_pid():
    """`arbiter-runtime after URL -- COMMAND`: nothing runs until URL answers 200; then COMMAND runs as the same
    process (the supervisor's signals and the CPU readings reach the engine it became)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "arbiter_runtime", "after", f"http://127.0.0.1:{port}/health", "--",
                             sys.executable, "-c", "import os, json; print(json.dumps(os.getpid()))"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None  # nothing answers yet: still waiting, the command not started
        _Page.pages = {port: (200, b"ok")}
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Page)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(server.serve_forever)
            out, err = proc.communicate(timeout=20)
            server.shutdown()
        assert proc.returncode == 0, err
        assert json.loads(out) == proc.pid
    finally:
        if proc.poll() is None:
            proc.kill()


def test_after_refuses_a_command_line_it_cannot_read():
    r = subprocess.run([sys.executable, "-m", "arbiter_runtime", "after", "http://127.0.0.1:1/health"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage: arbiter-runtime after URL -- COMMAND" in r.stderr


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An engine on its way up, at its worst: 503s, a 200 that is not HTTP, a connection closed mid-answer."""

    answers: ClassVar[list[bytes]] = []

    def do_GET(self) -> None:
        raw = type(self).answers.pop(0) if type(self).answers else b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        self.wfile.write(raw)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_after_starts_nothing_on_any_answer_but_a_200():
    # The last is a 200 cut short: the status is the engine's answer, its body is not read.
    _Hostile.answers = [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                        b"\x00\xffnot http at all\r\n\r\n", b"",
                        b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\n\r\n",
                        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nshort"]
    with serving(_Hostile) as url:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "arbiter_runtime", "after", url + "/health", "--", sys.executable,
                               "-c", "print('started')"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr
    assert not _Hostile.answers  # every hostile answer was read and waited past before the command ran
    assert time.monotonic() - started >= 4 * 0.5  # a poll interval after each of the four refused answers
