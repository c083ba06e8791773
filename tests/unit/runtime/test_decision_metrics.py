"""The series the promotion analysis divides and compares, scraped from /metrics after real requests.

Decision mix (arbiter_decision_labels_total), schema violations told apart from inconsistencies, low confidence,
and the shadow series pre-created as soon as shadow.json names a candidate.
"""

from __future__ import annotations

import json

from arbiter_runtime.service import RuntimeOptions
from support.hostile_upstream import HostileUpstream
from support.polling import eventually
from support.runtime_helpers import LABELS, base_config, scrape, series, v2_body, value

MV = {"model": "credit", "version": "v1"}


def test_decision_mix_counts_every_answer_by_final_label(runtime, standin):
    before = scrape(runtime)
    for label in LABELS:  # pre-created: a share exists (as 0) before the first decision
        assert value(before, "arbiter_decision_labels_total", **MV, label=label) == 0.0
    answered: list[str] = []
    with runtime.client() as c:
        docs = [{"amount": n * 37, "country": "DE"} for n in range(12)]
        body = c.post("/v2/models/credit/infer", json=v2_body(*docs)).json()
        answered += next(o for o in body["outputs"] if o["name"] == "decision")["data"]
        standin.set("failing")  # the rules decide: counted by the rules' label
        for amount in (20000, 5):
            answered.append(c.post("/v1/decisions", json={"amount": amount, "country": "US"}).json()["decision"])
        # a rejected request is not a decision and is not counted
        assert c.post("/v1/decisions", json={"amount": -1, "country": "US"}).status_code == 400
    after = scrape(runtime)
    assert answered[-2:] == ["deny", "review"]
    for label in LABELS:
        assert value(after, "arbiter_decision_labels_total", **MV, label=label) == answered.count(label)
    assert sum(series(after, "arbiter_decision_labels_total", **MV).values()) == 14


def test_schema_violations_and_inconsistencies_are_separate_kinds(standin, make_runtime):
    hostile = HostileUpstream(standin.url).start()
    try:
        server = make_runtime(base_config(hostile.url))
        first = scrape(server)
        assert value(first, "arbiter_schema_violations_total", **MV, kind="schema") == 0.0
        assert value(first, "arbiter_schema_violations_total", **MV, kind="inconsistent") == 0.0
        with server.client() as c:
            # the text writes one label while the log-probabilities favour another: 3 attempts, then the rules
            hostile.set_script(["flip_probabilities"])
            out = c.post("/v1/decisions", json={"amount": 7, "country": "DE"}).json()
            assert out["source"] == "rules" and out["fallbackReason"] == "invalid"
            standin.set("invalid")  # ignores the constraint: a format violation, 3 attempts
            hostile.set_script(["valid"])
            assert c.post("/v1/decisions", json={"amount": 8, "country": "DE"}).json()["source"] == "rules"
        after = scrape(server)
    finally:
        hostile.stop()
    assert value(after, "arbiter_schema_violations_total", **MV, kind="inconsistent") == 3.0
    assert value(after, "arbiter_schema_violations_total", **MV, kind="format") == 3.0
    assert value(after, "arbiter_fallbacks_total", **MV, reason="invalid") == 2.0


def test_low_confidence_is_its_own_outcome(standin, make_runtime):
    server = make_runtime(base_config(standin.url, confidenceThreshold=0.6))
    standin.set(distribution={"approve": 0.34, "deny": 0.33, "review": 0.33})  # unsure at every step
    with server.client() as c:
        for n in range(3):
            out = c.post("/v1/decisions", json={"amount": n, "country": "DE"}).json()
            assert out["lowConfidence"] is True and out["source"] == "model"
    after = scrape(server)
    assert value(after, "arbiter_decisions_total", **MV, outcome="low_confidence", source="model") == 3.0
    assert value(after, "arbiter_decisions_total", **MV, outcome="ok", source="model") == 0.0
    assert value(after, "arbiter_decision_labels_total", **MV, label="approve") == 3.0


def test_shadow_series_exist_from_the_moment_a_candidate_is_named(standin, make_runtime, tmp_path):
    shadow = tmp_path / "shadow.json"
    server = make_runtime(base_config(standin.url),
                          RuntimeOptions(shadow_config=str(shadow), shadow_poll_s=0.05))
    assert series(scrape(server), "arbiter_shadow_requests_total") == {}
    shadow.write_text(json.dumps({"candidate": "v2", "url": "http://127.0.0.1:9", "sampleRate": 0.0}))
    samples = eventually(lambda: series(s := scrape(server), "arbiter_shadow_requests_total") and s, 10,
                         "the shadow series", interval=0.05)
    for result in ("sent", "dropped", "error", "compared"):
        assert value(samples, "arbiter_shadow_requests_total", **MV, candidate="v2", result=result) == 0.0
    confusion = series(samples, "arbiter_shadow_comparisons_total", **MV, candidate="v2")
    assert len(confusion) == len(LABELS) ** 2
    agreeing = {dict(k)["stable_label"] for k in confusion if dict(k)["agree"] == "true"}
    assert agreeing == set(LABELS)
    assert value(samples, "arbiter_shadow_in_flight", **MV) == 0.0


def test_decisions_slower_than_the_declared_p95_are_counted_against_it(standin, make_runtime):
    """The latency alerts' bad events: the objective is the version's metadata.sla.p95LatencyMs, exported beside
    the count of decisions slower than it (a histogram bucket cannot stand for an arbitrary objective)."""
    for objective_ms, slow in ((1, 3.0), (600000, 0.0)):
        server = make_runtime(base_config(standin.url, sla={"p95LatencyMs": objective_ms}))
        with server.client() as c:
            for amount in (10, 20, 30):
                assert c.post("/v1/decisions", json={"amount": amount, "country": "DE"}).status_code == 200
        after = scrape(server)
        assert value(after, "arbiter_decision_latency_objective_seconds", **MV) == objective_ms / 1000
        assert value(after, "arbiter_decisions_over_objective_total", **MV) == slow
