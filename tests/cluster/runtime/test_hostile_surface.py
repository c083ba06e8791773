"""The decision server under hostile callers and a hostile upstream: a decision, a 4xx naming the problem, or a 503
saying why; never a 500, never a self-contradicting decision, one audit record per row that left the server.

The property fuzz runs a few thousand cases here; benchmarks/runtime_fuzz.py runs tens of thousands.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from arbiter_devenv.vllm_standin import StandinServer
from arbiter_runtime.config import parse_config
from arbiter_runtime.fallback import RulesEngine
from arbiter_runtime.inputs import MAX_BODY_BYTES, MAX_DEPTH, canonicalise
from arbiter_runtime.protocol import BadRequest
from arbiter_runtime.service import RuntimeOptions
from arbiter_runtime.trajectory import InputInvalid, InputValidator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzz_surface import Oracle, cases, documents, fuzz_config
from support.hostile_upstream import HostileUpstream
from support.runtime_helpers import CODES, LABELS, ListSink, RuntimeServer

FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))


class Surface:
    """A stand-in, optionally a hostile upstream in front of it, and the decision server in front of that."""

    def __init__(self, hostile: bool, mode: str = "scored", deadline_ms: int = 300, fused: bool = False):
        # fused: a model whose tokenizer has every (code, label) pair as one token, answering one token per step.
        words = tuple(c + x for c in CODES for x in LABELS) if fused else LABELS
        self.standin = StandinServer(words=words, served_model_name="credit-v1", added_tokens=fused).start()
        self.hostile = HostileUpstream(self.standin.url, slow_s=0.6).start() if hostile else None
        upstream = self.hostile.url if self.hostile else self.standin.url
        self.raw_cfg = fuzz_config(upstream, mode, deadline_ms)
        if fused:
            self.raw_cfg["scoredFormat"] = "fused"
        self.runtime = RuntimeServer(self.raw_cfg, RuntimeOptions(audit_sinks=[ListSink()])).start()
        self.oracle = Oracle(self.raw_cfg, self.runtime)
        self.client = httpx.Client(base_url=self.runtime.url, timeout=30)  # one keep-alive connection throughout

    def close(self) -> None:
        self.client.close()
        self.runtime.stop()
        if self.hostile:
            self.hostile.stop()
        self.standin.stop()

    def run(self, case) -> None:
        before = (len(self.oracle.tally.server_errors), len(self.oracle.tally.inconsistent),
                  len(self.oracle.tally.audit_mismatches))
        self.oracle.check(self.client, case, self.hostile)
        t = self.oracle.tally
        new = (t.server_errors[before[0]:] + t.inconsistent[before[1]:] + t.audit_mismatches[before[2]:])
        assert not new, new


def reached_both_paths(s: Surface) -> None:
    """The fuzz is only worth something if it got decisions from the model and from the rules. Checked when the
    module's server goes, on whichever worker ran its fuzz (a test of its own could land on another, and see none)."""
    t = s.oracle.tally
    if t.cases == 0:
        return  # no fuzz ran against this server (deselected)
    assert t.by_source.get("model", 0) > 0 and t.by_source.get("rules", 0) > 0, t.summary()
    assert t.by_status.get(200, 0) > 0 and t.by_status.get(400, 0) > 0 and t.by_status.get(415, 0) > 0


@pytest.fixture(scope="module")
def standin_surface():
    s = Surface(hostile=False)
    yield s
    try:
        reached_both_paths(s)
    finally:
        s.close()


@pytest.fixture(scope="module")
def hostile_surface():
    s = Surface(hostile=True)
    yield s
    try:
        reached_both_paths(s)
    finally:
        s.close()


@pytest.fixture(scope="module")
def hostile_fused_surface():
    s = Surface(hostile=True, fused=True)
    yield s
    try:
        reached_both_paths(s)
    finally:
        s.close()


@pytest.fixture(scope="module")
def hostile_generated_surface():
    s = Surface(hostile=True, mode="generated")
    yield s
    s.close()


@settings(FUZZ, max_examples=800)
@given(case=cases())
def test_fuzz_http_surface_against_the_standin(standin_surface, case):
    standin_surface.run(case)


@settings(FUZZ, max_examples=1200)
@given(case=cases(hostile=True))
def test_fuzz_http_surface_against_a_hostile_upstream(hostile_surface, case):
    hostile_surface.run(case)


@settings(FUZZ, max_examples=400)
@given(case=cases(hostile=True))
def test_fuzz_the_fused_format_against_a_hostile_upstream(hostile_fused_surface, case):
    hostile_fused_surface.run(case)


@settings(FUZZ, max_examples=400)
@given(case=cases(hostile=True))
def test_fuzz_generated_mode_against_a_hostile_upstream(hostile_generated_surface, case):
    hostile_generated_surface.run(case)


# -- specific edges, each a thing a caller would notice ----------------------------------------------------------

@pytest.fixture
def surface():
    s = Surface(hostile=True, deadline_ms=5000)  # time for three attempts on a busy machine
    yield s
    s.close()


def _decide(client, doc, **kw):
    return client.post("/v1/decisions", content=json.dumps(doc, ensure_ascii=True),
                       headers={"content-type": "application/json"}, **kw)


def test_integral_numbers_decide_and_digest_alike(surface):
    for n in (1200, 0, 75, 9_999_999):
        answers = []
        for amount in (n, float(n)):
            r = _decide(surface.client, {"amount": amount, "country": "DE", "count": amount})
            assert r.status_code == 200, r.text
            answers.append(r.json())
        assert answers[0]["decision"] == answers[1]["decision"]
        assert answers[0]["trajectory"] == answers[1]["trajectory"]
    records = surface.runtime.records_since(0)
    digests = [r["inputDigest"] for r in records]
    assert digests[0::2] == digests[1::2]


@pytest.mark.parametrize("doc, words", [
    ({"amount": 1, "country": "\ud800"}, "not valid Unicode"),
    ({"amount": 10 ** 400, "country": "DE"}, "out of range"),
    ({"amount": 1, "country": "DE", "extra": json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))},
     "nested deeper"),
    ({"amount": 1, "country": "DE", "\udfff": 1}, "not valid Unicode"),
])
def test_inputs_the_rules_could_not_read_are_rejected_by_name(surface, doc, words):
    r = _decide(surface.client, doc)
    assert r.status_code == 400 and words in r.json()["error"], r.text
    v2 = surface.client.post("/v2/models/credit/infer", json={"inputs": [{
        "name": "input", "shape": [2], "datatype": "BYTES",
        "data": [json.dumps({"amount": 1, "country": "DE"}), json.dumps(doc, ensure_ascii=True)]}]})
    assert v2.status_code == 400 and v2.json()["error"].startswith("row 1: ")
    assert surface.runtime.records_since(0) == []  # nothing was decided, nothing audited


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml",
                                          "application/json; charset=iso-8859-1"])
def test_bodies_that_are_not_json_get_415(surface, content_type):
    r = surface.client.post("/v1/decisions", content=b'{"amount": 1, "country": "DE"}',
                            headers={"content-type": content_type})
    error = r.json()["error"]
    assert r.status_code == 415 and ("application/json" in error or "UTF-8" in error), error


def _raw_exchange(port: int, request: bytes, sock: socket.socket | None = None) -> tuple[socket.socket, bytes]:
    sock = sock or socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return sock, head + b"\r\n\r\n" + rest


def _post(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


def test_a_keep_alive_connection_survives_every_kind_of_error(surface):
    port = surface.runtime.port
    good = _post("/v1/decisions", b'{"amount": 5, "country": "DE"}')
    sock = None
    for bad in (_post("/v1/decisions", b"{", ), _post("/v1/decisions", b"x", "text/plain"),
                _post("/v1/decisions", b'{"amount": 1, "country": "\\ud800"}'),
                _post("/v2/models/nope/infer", b"{}"), _post("/v1/decisions", b'{"amount": 1e999}')):
        sock, answer = _raw_exchange(port, bad, sock)
        assert answer.split(b" ")[1] in (b"400", b"404", b"415")
        surface.hostile.set_script(["logprob_string", "http_500", "reset"])  # the upstream fails every attempt
        sock, answer = _raw_exchange(port, good, sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert b'"source":"rules"' in answer and b'"fallbackReason":"upstream_error"' in answer
    sock.close()


def test_an_oversized_chunked_body_is_refused_while_it_streams(surface):
    """The 413 comes once the limit is passed, before the client has finished sending: the body is not buffered."""
    sock = socket.create_connection(("127.0.0.1", surface.runtime.port), timeout=10)
    sock.sendall(b"POST /v1/decisions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    answer = b""
    sock.settimeout(0.05)
    for _ in range(MAX_BODY_BYTES // (1 << 20) + 40):  # up to 40 MiB more than the limit, never finished
        try:
            sock.sendall(chunk)
        except OSError:
            break
        try:
            answer += sock.recv(65536)
        except TimeoutError:
            continue
        if answer:
            break
    sock.settimeout(5)
    while b"\r\n\r\n" not in answer:
        part = sock.recv(65536)
        if not part:
            break
        answer += part
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_upstream_answers_that_deviate_are_counted_and_audited(surface):
    surface.hostile.set_script(["top_logprobs_string"])
    r = _decide(surface.client, {"amount": 5, "country": "DE"})
    assert r.status_code == 200 and r.json()["source"] == "rules" and r.json()["fallbackReason"] == "upstream_error"
    assert r.json()["confidence"] is None and r.json()["rule"] == "default"
    (record,) = surface.runtime.records_since(0)
    assert record["source"] == "rules" and len(record["notes"]) == 3 and "top_logprobs" in record["notes"][0]
    metrics = surface.client.get("/metrics").text
    assert 'arbiter_upstream_errors_total{kind="protocol",model="credit",version="v1"} 3.0' in metrics


def test_contradicting_answers_are_never_decisions(surface):
    for script in (["flip_probabilities"], ["positive_logprob"]):
        surface.hostile.set_script(script)
        r = _decide(surface.client, {"amount": 5, "country": "DE"})
        assert r.status_code == 200 and r.json()["source"] == "rules", r.text
    reasons = [rec["fallbackReason"] for rec in surface.runtime.records_since(0)]
    assert reasons == ["invalid", "upstream_error"]


def test_a_batch_that_cannot_be_fully_decided_audits_only_what_left(surface):
    """A 503 for the batch: the rows with no decision are named and recorded; the decided rows never left."""
    cfg = fuzz_config(surface.hostile.url, deadline_ms=5000)
    cfg["fallbackRules"] = [r for r in cfg["fallbackRules"] if r["name"] == "large-amount"]
    rt = RuntimeServer(cfg, RuntimeOptions(audit_sinks=[ListSink()])).start()
    try:
        surface.hostile.set_script(["valid"])
        with rt.client() as c:
            r = c.post("/v2/models/credit/infer", json={"inputs": [{
                "name": "input", "shape": [2], "datatype": "BYTES",
                "data": [json.dumps({"amount": 20000, "country": "DE"}), json.dumps({"amount": 1, "country": "DE"})]}]})
            assert r.status_code == 200, r.text
            surface.hostile.set_script(["http_500"])
            r = c.post("/v2/models/credit/infer", json={"inputs": [{
                "name": "input", "shape": [2], "datatype": "BYTES",
                "data": [json.dumps({"amount": 20000, "country": "DE"}), json.dumps({"amount": 1, "country": "DE"})]}]})
        assert r.status_code == 503 and r.json()["rows"] == [1] and "no fallback rule matched" in r.json()["error"]
        assert rt.runtime.audit.wait_written(5)
        records = rt.records_since(0)
        assert [(rec["row"], rec["outcome"]) for rec in records[-1:]] == [(1, "error")]
        assert len(records) == 3  # 2 rows of the first answer + the failed row of the second
    finally:
        rt.stop()


def test_a_stalled_audit_sink_never_blocks_answers_and_loses_nothing(surface):
    class StalledSink(ListSink):
        def __init__(self):
            super().__init__()
            self.go = threading.Event()

        def write(self, line):
            self.go.wait()
            super().write(line)

    sink = StalledSink()
    rt = RuntimeServer(fuzz_config(surface.standin.url), RuntimeOptions(audit_sinks=[sink], audit_capacity=5)).start()
    try:
        with rt.client() as c:
            statuses = [_decide(c, {"amount": i, "country": "DE"}).status_code for i in range(8)]
            assert statuses[:5] == [200] * 5 and statuses[5:] == [503] * 3
            refused = _decide(c, {"amount": 1, "country": "DE"})
            assert "audit queue full" in refused.json()["error"] and refused.headers["retry-after"] == "1"
            assert c.get("/v2/health/live").status_code == 200
            assert "arbiter_audit_queue_depth" in c.get("/metrics").text
            sink.go.set()
            assert rt.runtime.audit.wait_written(5)
            assert len(sink.lines) == 5
            assert _decide(c, {"amount": 1, "country": "DE"}).status_code == 200
    finally:
        sink.go.set()
        rt.stop()


def test_readiness_follows_the_upstream(surface):
    standin = StandinServer(words=LABELS, served_model_name="credit-v1").start()
    opts = RuntimeOptions(audit_sinks=[ListSink()], upstream_watch_s=0.1)
    rt = RuntimeServer(fuzz_config(standin.url), opts).start()
    try:
        with rt.client() as c:
            assert c.get("/v2/health/ready").status_code == 200
            standin.stop()
            deadline = time.monotonic() + 10
            while c.get("/v2/health/ready").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            ready = c.get("/v2/health/ready")
            assert ready.status_code == 503 and "has not answered /health" in ready.json()["error"]
            assert 'arbiter_upstream_up{model="credit",version="v1"} 0.0' in c.get("/metrics").text
            r = _decide(c, {"amount": 5, "country": "DE"})  # a caller still pinned to the pod gets the rules
            assert r.status_code == 200 and r.json()["fallbackReason"] == "upstream_down"
            back = StandinServer(words=LABELS, served_model_name="credit-v1", port=standin.port).start()
            try:
                deadline = time.monotonic() + 10
                while c.get("/v2/health/ready").status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert c.get("/v2/health/ready").status_code == 200
            finally:
                back.stop()
    finally:
        rt.stop()
        standin.stop()


# -- the rules path is total -------------------------------------------------------------------------------------

_RULES_CFG = parse_config(fuzz_config("http://127.0.0.1:1/v1"))
_RULES = RulesEngine(_RULES_CFG.fallback_rules)
_VALIDATOR = InputValidator(_RULES_CFG.input_schema)


@settings(max_examples=600, deadline=None, database=None)
@given(doc=documents, reason=st.sampled_from(["upstream_down", "deadline", "invalid", "low_confidence"]),
       model_conf=st.one_of(st.none(), st.floats(0, 1)))
def test_every_valid_input_gets_a_rules_decision(doc, reason, model_conf):
    try:
        doc = canonicalise(doc)
        _VALIDATOR.check(doc)
    except (BadRequest, InputInvalid):
        return
    model = None if model_conf is None else {"decision": "approve", "confidence": model_conf, "trajectory": {}}
    before = _RULES.eval_errors
    decided = _RULES.decide(doc, model, reason)
    assert decided is not None and decided.decision in LABELS
    amount = doc["amount"]
    if amount > 10000:
        assert decided.rule == "large-amount"
    assert _RULES.eval_errors - before <= 2  # only rules reading absent fields may fail, never the conversion


def test_serve_exits_0_after_a_clean_sigterm(standin, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from arbiter_devenv.vllm_standin import free_port

    port = free_port()
    cfg = tmp_path / "decision.json"
    cfg.write_text(json.dumps(fuzz_config(standin.url)))
    proc = subprocess.Popen([sys.executable, "-m", "arbiter_runtime", "serve", "--config", str(cfg), "--port",
                             str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not become ready"
            time.sleep(0.1)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/decisions", json={"amount": 5, "country": "DE"}, timeout=10)
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_deadline_reserve_grows_when_fallbacks_land_late_and_stays_bounded():
    from arbiter_runtime.decide import DeadlineReserve

    r = DeadlineReserve(0.250)
    assert r.s == pytest.approx(0.025)
    r.observe(0.300)  # 87.5 ms past 85% of the deadline
    assert r.s == pytest.approx(0.025 + DeadlineReserve.GROW * (0.300 - 0.2125))
    for _ in range(1000):
        r.observe(5.0)
    assert r.s == pytest.approx(0.125)  # never more than half the deadline
    for _ in range(20000):
        r.observe(0.100)
    assert r.s == pytest.approx(0.025)  # back to the floor once fallbacks are early again
