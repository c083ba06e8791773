"""The process harness (runtime_procs.py): each misbehaviour shows in the series a user would alert on, and a real
Prometheus scraping real decision-server processes sees the decision mix and the shadow agreement per version."""

from __future__ import annotations

import functools
import json
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.polling import eventually
from support.promstack import PromStack
from support.runtime_procs import CASES, LABELS, RuntimeFleet


def samples(proc) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(proc.metrics_text()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(proc, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, k), v in samples(proc).items() if n == name and want <= set(k))


wait_for = functools.partial(eventually, timeout=30.0, interval=0.2)


@pytest.mark.slow
def test_each_behaviour_shows_in_the_runtime_series(tmp_path):
    with RuntimeFleet(tmp_path) as fleet:
        v = fleet.start_version("v1")

        def run(n: int = 6) -> list[dict]:
            return [v.decide(CASES[i]) for i in range(n)]

        healthy = run()
        assert all(d["source"] == "model" and not d["lowConfidence"] for d in healthy)
        assert {d["decision"] for d in healthy} == set(LABELS)  # a spread mix, not one label

        v.misbehave("fallback")
        before = total(v, "arbiter_fallbacks_total", reason="upstream_error")
        assert all(d["source"] == "rules" and d["fallbackReason"] == "upstream_error" for d in run())
        assert total(v, "arbiter_fallbacks_total", reason="upstream_error") == before + 6

        v.misbehave("schema")
        before = total(v, "arbiter_schema_violations_total", kind="format")
        assert all(d["fallbackReason"] == "invalid" for d in run(2))
        assert total(v, "arbiter_schema_violations_total", kind="format") == before + 6  # 3 attempts each
        assert total(v, "arbiter_schema_violations_total", kind="inconsistent") == 0

        v.misbehave("low_confidence")
        before = total(v, "arbiter_decisions_total", outcome="low_confidence")
        assert all(d["lowConfidence"] and d["source"] == "model" for d in run())
        assert total(v, "arbiter_decisions_total", outcome="low_confidence") == before + 6

        v.misbehave("approve_all")
        before = total(v, "arbiter_decision_labels_total", label="approve")
        assert {d["decision"] for d in run()} == {"approve"}
        assert total(v, "arbiter_decision_labels_total", label="approve") == before + 6

        v.misbehave("down")
        assert all(d["fallbackReason"] == "upstream_down" for d in run(2))
        v.misbehave("healthy")
        assert [d["decision"] for d in run()] == [d["decision"] for d in healthy]  # same answers as before
        wait_for(lambda: len([r for r in v.records() if r["kind"] == "arbiter.decision"]) == 6 * 5 + 2 * 2,
                 what="one audit record per decision")
    assert v.server.poll() is not None and v.upstream.poll() is not None  # nothing left running


@pytest.mark.slow
def test_prometheus_scrapes_the_mix_and_the_shadow_agreement_per_version(tmp_path):
    (tmp_path / "prom").mkdir()
    stack = PromStack(tmp_path / "prom").start()
    try:
        with RuntimeFleet(tmp_path / "fleet", namespace="team-a") as fleet:
            v1, v2 = fleet.start_version("v1"), fleet.start_version("v2")
            stack.add_runtime(v1)
            stack.add_runtime(v2)
            v1.write_shadow(v2, sample_rate=1.0, timeout_ms=2000, max_in_flight=16)
            traffic = fleet.traffic({v1: 25})

            def query(q: str) -> dict[str, float]:
                url = f"{stack.url}/api/v1/query?" + urllib.parse.urlencode({"query": q})
                with urllib.request.urlopen(url, timeout=10) as resp:
                    result = json.load(resp)["data"]["result"]
                return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}

            agreement = ('sum by (arbiter_dev_version, candidate) (arbiter_shadow_comparisons_total{agree="true",'
                         'namespace="team-a"}) / sum by (arbiter_dev_version, candidate) '
                         '(arbiter_shadow_comparisons_total{namespace="team-a"})')
            compared = 'sum(arbiter_shadow_comparisons_total{arbiter_dev_version="v1",candidate="v2"})'
            wait_for(lambda: query(compared) and next(iter(query(compared).values())) >= 40, what="40 comparisons")
            (value,) = query(agreement).values()
            assert value == 1.0  # two healthy versions decide every case alike

            # the candidate decided the mirrored cases: its own decision mix, from its own pod's series
            mix = ('sum by (arbiter_dev_version, label) (arbiter_decision_labels_total{namespace="team-a"}) / '
                   'ignoring(label) group_left sum by (arbiter_dev_version) '
                   '(arbiter_decision_labels_total{namespace="team-a"})')
            # The two pods are scraped at different moments while traffic goes on, so a scrape can see decisions one
            # version has made and the other not yet: the mixes must come within 0.1 of each other, not at once.
            def alike() -> bool:
                shares = query(mix)
                if len(shares) != 6:
                    return False
                for label in LABELS:
                    per_version = [v for k, v in shares.items() if json.loads(k)["label"] == label]
                    if not (len(per_version) == 2 and abs(per_version[0] - per_version[1]) < 0.1):
                        return False
                return True

            wait_for(alike, what="the candidate's decision mix within 0.1 of the stable's, label by label")
            # vLLM's series come from a second scrape job (/metrics/vllm), on its own schedule
            wait_for(lambda: query('vllm:kv_cache_usage_perc{arbiter_dev_version="v2",namespace="team-a"}'),
                     what="vLLM's KV-cache series scraped through /metrics/vllm")

            v2.misbehave("disagree")
            seen = next(iter(query(compared).values()))
            wait_for(lambda: next(iter(query(compared).values())) >= seen + 60, what="60 more comparisons")
            window = ('sum(increase(arbiter_shadow_comparisons_total{agree="true",candidate="v2"}[3s])) / '
                      'sum(increase(arbiter_shadow_comparisons_total{candidate="v2"}[3s]))')
            (recent,) = wait_for(lambda: (r := query(window)) and next(iter(r.values())) < 0.7 and r).values()
            assert recent < 0.7
            traffic.stop()
            assert traffic.failed == {} and traffic.answered["v1"] >= 100
    finally:
        stack.stop()
