"""A custom check's PromQL is the user's text, sent to a real Prometheus as written: whatever it is (not PromQL at all,
a string or a range vector, NaN, infinities, thousands of series, placeholders half-typed), the analysis answers with
a verdict a user can act on and that the status can hold, and never passes a step on a check that measured nothing."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from arbiter_operator.api.promotion import Analysis, AnalysisRun, CanaryStep, MetricCheck, PromoteSpec, PromotionStatus
from arbiter_operator.clients.prometheus import PrometheusClient, PrometheusConfig
from arbiter_operator.observe.analysis import run_analysis
from arbiter_operator.promotion import analysis_due
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.promstack import PromStack

NS, MODEL = "fraud", "claims"

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    stack = PromStack(tmp_path_factory.mktemp("prom"))
    try:
        stack.start()
        for version in ("v1", "v2"):
            stack.add_workload(NS, MODEL, version).control(rps=40, latency_ms=40, error_rate=0.0)
        yield stack
    finally:
        stack.stop()


PLACEHOLDERS = ["{{candidate}}", "{{stable}}", "{{window}}", "{{namespace}}", "{{model}}", "{{candidateVersion}}",
                "{{stableVersion}}", "{{", "}}", "{{unknown}}", "{{{candidate}}}"]
# Answers of every shape Prometheus gives: scalars (finite, NaN, infinite, overflowing), empty and huge vectors,
# strings and range vectors (which the client refuses), parse and execution errors.
SHAPES = [
    "vector(0.5)", "vector(1)", "0.25", "NaN", "+Inf", "-Inf", "1e308 * 10", "vector(0) / 0", "-vector(3)",
    "absent(nonexistent_metric)", "nonexistent_metric", "up", '{__name__=~".+"}', "count(up)", '"a string"',
    "up[1m]", "time()", "sum(rate(arbiter_decisions_total{ {{candidate}} }[{{window}}]))",
    'sum(rate(arbiter_decisions_total{ {{stable}} }[{{window}}])) / sum(rate(arbiter_decisions_total[{{window}}]))',
    "sum(", "rate(up[-1m])", "label_replace(up, 'x', '$1', 'job', '(.*)')", "1 +", "topk(-1, up)",
    "sum by (le) (rate(arbiter_decision_duration_seconds_bucket{ {{candidate}} }[{{window}}]))",
    "histogram_quantile(2, sum by (le) (rate(arbiter_decision_duration_seconds_bucket[{{window}}])))",
]
queries = st.one_of(
    st.sampled_from(SHAPES),
    st.lists(st.one_of(st.sampled_from(SHAPES), st.sampled_from(PLACEHOLDERS), st.text(max_size=20)),
             min_size=1, max_size=6).map(" ".join),
    st.text(min_size=1, max_size=200),
    st.text(alphabet="{}()[]\"'\\,=~!<>+-*/^ 0123456789abcdefghijklmnopqrstuvwxyz_:.", min_size=1, max_size=300),
    st.integers(min_value=1, max_value=4000).map(lambda n: ("vector(1) + " * (n // 12 + 1))[:4000]),
).map(lambda q: q[:4000]).filter(lambda q: q.strip() != "")
bounds = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.sampled_from([0.0, 0.5, 1.0]))


def _query(check: MetricCheck):
    spec = PromoteSpec(version="v2", strategy="Canary", steps=[CanaryStep(weight=10, holdSeconds=0)],
                       analysis=Analysis(intervalSeconds=5, minRequests=1, checks=[check]))
    now = datetime.now(UTC)
    started = (now - timedelta(seconds=60)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    status = PromotionStatus(phase="Progressing", stable="v1", candidate="v2", step=0, weight=10,
                             stepStartedAt=started)
    query = analysis_due(spec, status, now, namespace=NS, model=MODEL, sla_p95_ms=1000.0)
    assert query is not None
    return query


async def _analyse(url: str, check: MetricCheck) -> AnalysisRun:
    async with PrometheusClient(PrometheusConfig(url=url)) as prom:
        return await run_analysis(prom, _query(check))


def _wait_for_traffic(url: str) -> None:
    """The built-in gates pass on the workloads' traffic, so that every verdict below is the custom check's doing."""
    check = MetricCheck(name="always", query="vector(0)", bound=1)
    for _ in range(120):
        if asyncio.run(_analyse(url, check)).verdict == "Pass":
            return
        asyncio.run(asyncio.sleep(0.5))
    pytest.fail("the built-in gates never passed on the stand-in workloads' traffic")


def test_any_custom_check_text_gets_a_verdict_the_status_can_hold(prometheus):
    _wait_for_traffic(prometheus.url)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(query=queries, bound=bounds, direction=st.sampled_from(["max", "min"]))
    def check(query, bound, direction):
        run = asyncio.run(_analyse(prometheus.url, MetricCheck(name="custom", query=query, bound=bound,
                                                                direction=direction)))
        assert run.verdict in ("Pass", "Fail", "Inconclusive")
        json.loads(run.model_dump_json())  # finite numbers only: the status patch is JSON
        assert len(run.message) <= 1000
        mine = [c for c in run.checks if c.name == "custom"]
        if not mine:
            # No result at all: only when a query failed, and the message says it was this check's.
            assert run.verdict == "Inconclusive" and "check custom:" in run.message, run.message
            return
        result = mine[0]
        if result.value is None:
            assert result.verdict == "NoData" and run.verdict != "Pass", run
        else:
            assert math.isfinite(result.value)
            over = result.value > bound if direction == "max" else result.value < bound
            assert result.verdict == ("Fail" if over else "Pass"), result
            if over:
                assert run.verdict == "Fail" and "custom" in run.message, run.message

    check()
