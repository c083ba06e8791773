"""Shadow mode: the stable mirrors sampled requests to a candidate, after and apart from the caller's answer.

Real decision servers on loopback (the stable and a candidate), shadow.json re-read from disk, and a hostile
candidate (hostile_candidate.py) that hangs, drips, fails, answers garbage or huge bodies, resets connections and
invents labels: the stable's answers, their latency and its health never depend on it.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from pathlib import Path

import pytest
from arbiter_runtime.service import RuntimeOptions
from arbiter_runtime.shadow import MAX_ANSWER_BYTES, OTHER_LABEL, ShadowConfigError, parse_shadow, parse_shadow_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile_candidate import BEHAVIOURS, EXPECTED, HostileCandidate
from support.polling import eventually
from support.runtime_helpers import LABELS, ListSink, base_config, scrape, series, v2_body, value

MV = {"model": "credit", "version": "v1"}
DOCS = [{"amount": n * 53, "country": c} for n, c in zip(range(40), ["DE", "US", "FR", "PL"] * 10, strict=True)]


def shadow_json(path: Path, **cfg) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg))
    tmp.replace(path)  # as the kubelet swaps a ConfigMap's files: never half a file


wait_for = functools.partial(eventually, timeout=15.0, interval=0.02)


def shadow_counts(server, candidate: str, version: str = "v1") -> dict[str, float]:
    samples = scrape(server)
    return {r: value(samples, "arbiter_shadow_requests_total", model="credit", version=version, candidate=candidate,
                     result=r)
            for r in ("sent", "dropped", "error", "compared")}


def settled(server) -> bool:
    """No mirrored request waits and every audit record is written (the writer thread lags the counters)."""
    audit = server.runtime.audit
    return server.runtime.shadow.in_flight == 0 and (audit is None or audit.depth == 0)


@pytest.fixture
def stable_and_candidate(standin, make_runtime, tmp_path):
    """v1 (stable) mirrors to v2 (candidate); both real servers in front of the same stand-in. The candidate has a
    shadow.json of its own pointing back at v1, which it must never use for shadow traffic."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    candidate = make_runtime(base_config(standin.url, version="v2"),
                             RuntimeOptions(audit_sinks=[ListSink()], shadow_config=str(tmp_path / "v2/shadow.json"),
                                            shadow_poll_s=0.05))
    stable = make_runtime(base_config(standin.url),
                          RuntimeOptions(audit_sinks=[ListSink()], shadow_config=str(tmp_path / "v1/shadow.json"),
                                         shadow_poll_s=0.05))
    shadow_json(tmp_path / "v2/shadow.json", candidate="v1", url=stable.url, sampleRate=1.0)
    return stable, candidate, tmp_path / "v1/shadow.json"


def test_mirrored_requests_are_compared_and_audited_on_both_sides(stable_and_candidate, tmp_path):
    stable, candidate, path = stable_and_candidate
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    shadow_json(path, candidate="v2", url=candidate.url, sampleRate=1.0, timeoutMs=5000, maxInFlight=8,
                tokenFile=str(token))
    wait_for(lambda: stable.runtime.shadow.config is not None, what="shadow.json to be read")
    answers = []
    with stable.client() as c:
        for i in range(0, 9, 3):
            r = c.post("/v2/models/credit/infer", json=v2_body(*DOCS[i:i + 3], id=f"batch-{i}"))
            answers += next(o for o in r.json()["outputs"] if o["name"] == "decision")["data"]
        r = c.post("/v1/decisions", json=DOCS[20])
        answers.append(r.json()["decision"])
    wait_for(lambda: settled(stable) and shadow_counts(stable, "v2")["compared"] == 4, what="4 comparisons")
    counts = shadow_counts(stable, "v2")
    assert counts == {"sent": 4, "dropped": 0, "error": 0, "compared": 4}

    mine = [r for r in stable.records_since(0) if r["kind"] == "arbiter.decision"]
    compared = [r for r in stable.records_since(0) if r["kind"] == "arbiter.shadow"]
    theirs = [r for r in candidate.records_since(0) if r["kind"] == "arbiter.decision"]
    assert len(mine) == len(compared) == len(theirs) == 10
    assert all(r["shadow"] is False for r in mine) and all(r["shadow"] is True for r in theirs + compared)
    # the candidate decided the same inputs, in the same trace, under the same request id
    by_key = {(r["traceId"], r["requestId"], r["row"]): r for r in theirs}
    for rec in compared:
        twin = by_key[(rec["traceId"], rec["requestId"], rec["row"])]
        assert twin["inputDigest"] == rec["inputDigest"] and twin["version"] == "v2"
        assert rec["candidateDecision"] == twin["decision"] and rec["candidateSource"] == twin["source"]
        assert rec["agree"] == (rec["decision"] == twin["decision"])
    assert sorted(r["decision"] for r in compared) == sorted(answers)
    # the confusion matrix holds the same pairs
    samples = scrape(stable)
    for s in LABELS:
        for t in LABELS:
            pairs = sum(1 for r in compared if r["decision"] == s and r["candidateDecision"] == t)
            assert value(samples, "arbiter_shadow_comparisons_total", **MV, candidate="v2", stable_label=s,
                         candidate_label=t, agree=str(s == t).lower()) == pairs
    # the candidate counted the shadow traffic as its own decisions, and never mirrored it back (no loop)
    cand = scrape(candidate)
    assert sum(series(cand, "arbiter_decision_labels_total", model="credit", version="v2").values()) == 10
    assert shadow_counts(candidate, "v1", version="v2")["sent"] == 0


def test_caller_headers_and_token_reach_the_candidate(stable_and_candidate, tmp_path):
    stable, _, path = stable_and_candidate
    peer = HostileCandidate(stable.url, LABELS).start()
    try:
        token = tmp_path / "token"
        token.write_text("first-token\n")
        shadow_json(path, candidate="v2", url=peer.url, sampleRate=1.0, tokenFile=str(token))
        wait_for(lambda: stable.runtime.shadow.config is not None)
        with stable.client() as c:
            c.post("/v1/decisions", json=DOCS[0]).raise_for_status()
            wait_for(lambda: peer.requests >= 1)
            token.write_text("rotated-token\n")  # projected tokens rotate in place
            time.sleep(0.2)
            c.post("/v1/decisions", json=DOCS[1]).raise_for_status()
            wait_for(lambda: peer.requests >= 2)
        first, second = peer.headers_seen[-2:]
        assert first["authorization"] == "Bearer first-token" and second["authorization"] == "Bearer rotated-token"
        assert first["x-arbiter-shadow"] == "v1" and first["content-type"] == "application/json"
        assert "rotated-token" not in json.dumps(stable.records_since(0))
    finally:
        peer.stop()


def test_shadow_json_changes_apply_without_restart_and_a_bad_one_never_stops_serving(stable_and_candidate):
    stable, candidate, path = stable_and_candidate

    def one():
        with stable.client() as c:
            r = c.post("/v1/decisions", json=DOCS[3])
            assert r.status_code == 200 and r.json()["decision"] in LABELS

    one()
    assert series(scrape(stable), "arbiter_shadow_requests_total") == {}  # no file: off
    shadow_json(path, candidate="v2", url=candidate.url, sampleRate=1.0)
    wait_for(lambda: stable.runtime.shadow.config is not None)
    one()
    wait_for(lambda: shadow_counts(stable, "v2")["compared"] == 1)
    errors = lambda: value(scrape(stable), "arbiter_shadow_config_errors_total", **MV)  # noqa: E731
    for bad in ('{"candidate": "v2", "url": "ftp://x", "sampleRate": 1}', "{not json", '[]',
                '{"candidate": "v1", "url": "http://x"}', '{"candidate": "v2", "url": "http://x", "sampleRate": 2}',
                '{"candidate": "v2", "url": "http://x", "sampelRate": 1}'):
        before = errors()
        path.write_text(bad)
        wait_for(lambda before=before: errors() == before + 1, what=f"{bad!r} to be refused")
        assert stable.runtime.shadow.config is None
        one()  # still serving; nothing mirrored while the file is bad
    assert shadow_counts(stable, "v2")["sent"] == 1
    shadow_json(path, candidate="v2", url=candidate.url, sampleRate=1.0)
    wait_for(lambda: stable.runtime.shadow.config is not None)
    one()
    wait_for(lambda: shadow_counts(stable, "v2")["compared"] == 2)
    path.write_text("")  # empty: off, and not an error
    before = errors()
    wait_for(lambda: stable.runtime.shadow.config is None)
    one()
    assert errors() == before and shadow_counts(stable, "v2")["sent"] == 2
    path.unlink()
    one()


def test_a_hung_candidate_costs_the_callers_nothing_and_holds_at_most_max_in_flight(stable_and_candidate):
    stable, _, path = stable_and_candidate
    peer = HostileCandidate(stable.url, LABELS).start()
    peer.default = "hang"
    try:
        shadow_json(path, candidate="v2", url=peer.url, sampleRate=1.0, timeoutMs=4000, maxInFlight=3)
        wait_for(lambda: stable.runtime.shadow.config is not None)
        with stable.client() as c:
            for doc in DOCS[:10]:
                t0 = time.perf_counter()
                r = c.post("/v1/decisions", json=doc)
                # the caller's answer never waits for the 4 s the candidate may take
                assert r.status_code == 200 and time.perf_counter() - t0 < 2.0
        assert shadow_counts(stable, "v2") == {"sent": 3, "dropped": 7, "error": 0, "compared": 0}
        assert value(scrape(stable), "arbiter_shadow_in_flight", **MV) == 3
        wait_for(lambda: settled(stable), timeout=10)
        assert shadow_counts(stable, "v2") == {"sent": 3, "dropped": 7, "error": 3, "compared": 0}
        errors = [r for r in stable.records_since(0) if r["kind"] == "arbiter.shadow"]
        assert [r["error"] for r in errors] == ["no answer within timeoutMs (4000 ms)"] * 3
        assert stable.runtime.audit.depth == 0  # every slot the mirror held was given back
    finally:
        peer.stop()


def test_sample_rate_zero_mirrors_nothing_and_a_share_mirrors_about_that_share(stable_and_candidate):
    stable, candidate, path = stable_and_candidate
    shadow_json(path, candidate="v2", url=candidate.url, sampleRate=0.0)
    wait_for(lambda: stable.runtime.shadow.config is not None)
    with stable.client() as c:
        for doc in DOCS[:10]:
            c.post("/v1/decisions", json=doc).raise_for_status()
    assert shadow_counts(stable, "v2")["sent"] == 0
    shadow_json(path, candidate="v2", url=candidate.url, sampleRate=0.3)
    wait_for(lambda: stable.runtime.shadow.config.sample_rate == 0.3)
    with stable.client() as c:
        for n in range(200):
            c.post("/v1/decisions", json=DOCS[n % len(DOCS)]).raise_for_status()
    wait_for(lambda: settled(stable))
    sent = shadow_counts(stable, "v2")["sent"]
    assert 30 <= sent <= 95  # binomial(200, 0.3): 60 expected; outside this range ~1e-6


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(plan=st.lists(st.tuples(st.sampled_from(BEHAVIOURS), st.integers(1, 3)), min_size=1, max_size=8),
       unknown=st.text(min_size=1, max_size=200))
def test_hostile_candidate_never_changes_the_stables_answers(hostile_setup, plan, unknown):
    stable, peer, _ = hostile_setup
    peer.unknown_label = unknown
    check_plan(stable, peer, plan)


def test_every_hostile_behaviour_in_turn(hostile_setup):
    stable, peer, path = hostile_setup
    shadow_json(path, candidate="v2", url=peer.url, sampleRate=1.0, timeoutMs=1500, maxInFlight=64)
    wait_for(lambda: stable.runtime.shadow.config.max_in_flight == 64)
    plan = [(b, 2) for b in BEHAVIOURS if b != "hang"] + [("hang", 1)]
    results = check_plan(stable, peer, plan)
    assert results == {b: EXPECTED[b][0] for b, _ in plan}  # none dropped: each met its behaviour


def test_an_endless_candidate_answer_is_cut_at_its_bound_not_waited_out(hostile_setup):
    """The right decisions, then whitespace forever: the stable stops reading at MAX_ANSWER_BYTES and hangs up,
    recording the error long before timeoutMs, instead of holding the answer or the connection until then."""
    stable, peer, path = hostile_setup
    shadow_json(path, candidate="v2", url=peer.url, sampleRate=1.0, timeoutMs=30_000, maxInFlight=3)
    wait_for(lambda: stable.runtime.shadow.config.timeout_ms == 30_000)
    seen = len(stable.options.audit_sinks[0].lines)
    request_id = uuid.uuid4().hex
    peer.plan[request_id] = "endless"
    with stable.client() as c:
        c.post("/v2/models/credit/infer", json=v2_body(*DOCS[:3], id=request_id)).raise_for_status()
    wait_for(lambda: len(peer.endless_cut) == 1)  # the stable hung up on it
    wait_for(lambda: settled(stable))
    records = [json.loads(x) for x in stable.options.audit_sinks[0].lines[seen:]]
    [record] = [r for r in records if r["kind"] == "arbiter.shadow" and r["requestId"] == request_id]
    assert record["result"] == "error" and record["rows"] == 3
    assert f"over the {MAX_ANSWER_BYTES}-byte bound" in record["error"], record
    assert record["latencyMs"] < 10_000 and peer.endless_cut[0] < 10
    assert shadow_counts(stable, "v2")["error"] == 1


def check_plan(stable, peer, plan) -> dict[str, str]:
    """Send the plan's requests; check the callers' answers, then what the stable recorded for each. Returns the
    result (compared | error) recorded per behaviour met."""
    before = shadow_counts(stable, "v2")
    seen = len(stable.options.audit_sinks[0].lines)
    ids = []
    with stable.client() as c:
        for k, (behaviour, rows) in enumerate(plan):
            request_id = uuid.uuid4().hex
            ids.append((request_id, behaviour, rows))
            peer.plan[request_id] = behaviour
            docs = [DOCS[(k * 3 + j) % len(DOCS)] for j in range(rows)]
            t0 = time.perf_counter()
            mirrored = c.post("/v2/models/credit/infer", json=v2_body(*docs, id=request_id))
            elapsed = time.perf_counter() - t0
            # the same request as shadow traffic is never mirrored: the answer the stable gives on its own
            alone = c.post("/v2/models/credit/infer", json=v2_body(*docs, id=request_id),
                           headers={"X-Arbiter-Shadow": "test"})
            assert mirrored.status_code == alone.status_code == 200
            strip = lambda body: [o for o in body["outputs"] if o["name"] != "trajectory"] + [  # noqa: E731
                json.loads(x) for o in body["outputs"] if o["name"] == "trajectory" for x in o["data"]]
            assert strip(mirrored.json()) == strip(alone.json())
            assert elapsed < 1.0, f"the caller waited {elapsed:.2f}s with a {behaviour} candidate"
    wait_for(lambda: settled(stable), timeout=15)
    records = [json.loads(x) for x in stable.options.audit_sinks[0].lines[seen:]]
    shadow = [r for r in records if r["kind"] == "arbiter.shadow"]
    sent = {r["requestId"] for r in shadow}
    errors = compared = 0
    met = {}
    for k, (request_id, behaviour, rows) in enumerate(ids):
        mine = [r for r in shadow if r["requestId"] == request_id]
        if request_id not in sent:
            # Dropped: only when the in-flight bound (maxInFlight 3) was full, so never one of the first three (each
            # example starts with nothing in flight). How many are dropped depends on timing; the counts below agree.
            assert k >= 3, (k, behaviour)
            continue
        result, agree = EXPECTED[behaviour]
        met[behaviour] = result
        assert {r["result"] for r in mine} == {result}, (behaviour, mine)
        if result == "error":
            errors += 1
            assert len(mine) == 1 and mine[0]["rows"] == rows and mine[0]["error"]
        else:
            compared += 1
            assert sorted(r["row"] for r in mine) == list(range(rows))
            assert all(r["agree"] is agree for r in mine), (behaviour, mine)
    after = shadow_counts(stable, "v2")
    delta = {k: after[k] - before[k] for k in after}
    # Every mirrored attempt is either sent or dropped, every sent one ends compared or error, and the counters say
    # exactly what the audit trail shows (read once the audit queue is drained).
    assert delta["sent"] + delta["dropped"] == len(ids) and delta["compared"] + delta["error"] == delta["sent"]
    assert delta == {"sent": len(sent), "dropped": len(ids) - len(sent), "error": errors, "compared": compared}
    assert stable.runtime.audit.depth == 0
    samples = scrape(stable)
    other = series(samples, "arbiter_shadow_comparisons_total", **MV, candidate="v2", candidate_label=OTHER_LABEL)
    assert {dict(k)["stable_label"] for k in other} <= set(LABELS)  # no series grows from what a candidate says
    assert len(series(samples, "arbiter_shadow_comparisons_total")) <= len(LABELS) * (len(LABELS) + 1)
    with stable.client() as c:
        assert c.get("/v2/health/ready").status_code == 200
    return met


@pytest.fixture
def hostile_setup(standin, make_runtime, tmp_path):
    stable = make_runtime(base_config(standin.url),
                          RuntimeOptions(audit_sinks=[ListSink()], shadow_config=str(tmp_path / "shadow.json"),
                                         shadow_poll_s=0.05))
    peer = HostileCandidate(stable.url, LABELS, slow_s=0.3).start()
    shadow_json(tmp_path / "shadow.json", candidate="v2", url=peer.url, sampleRate=1.0, timeoutMs=1500,
                maxInFlight=3)
    wait_for(lambda: stable.runtime.shadow.config is not None)
    try:
        yield stable, peer, tmp_path / "shadow.json"
    finally:
        peer.stop()


@given(raw=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                            st.sampled_from(["candidate", "url", "sampleRate", "timeoutMs", "maxInFlight",
                                             "tokenFile", "x"]), kids, max_size=6), max_leaves=12))
def test_parse_shadow_refuses_or_accepts_never_crashes(raw):
    try:
        cfg = parse_shadow(raw, "v1")
    except ShadowConfigError as exc:
        assert str(exc)
        return
    assert cfg is None or (0 <= cfg.sample_rate <= 1 and cfg.candidate != "v1" and cfg.url.startswith("http"))


@given(data=st.binary(max_size=300))
def test_parse_shadow_bytes_never_crashes(data):
    try:
        parse_shadow_bytes(data, "v1")
    except ShadowConfigError:
        pass
