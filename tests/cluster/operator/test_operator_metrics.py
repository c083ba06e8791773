"""The operator's own Prometheus metrics: what an SRE scraping the metrics port sees while a DecisionModel converges,
and the pure parts behind them (promotion outcomes from status history, the work queue's depth and wait)."""

from __future__ import annotations

import asyncio
import time

from arbiter_operator import metrics
from arbiter_operator.kube.workqueue import PriorityWorkQueue as WorkQueue
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.operator_kit import condition, create_dm, eventually, example, get

DM = "credit-limit"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(page: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in page.items() if n == name and all((k, want) in lab for k, want in labels.items()))


def test_scrape_shows_reconciles_requests_and_queue_after_a_model_converges(
    control_plane, namespace, api, operator_process, predictors
):
    op = operator_process(namespaces=[namespace], metrics=True)
    before = samples(op.scrape())
    # Every operator metric is on the page from the start (an SRE's dashboards and alerts need the series to exist).
    assert any(n == "arbiter_operator_workqueue_depth" for n, _ in before)
    assert total(before, "arbiter_operator_reconcile_total") == 0

    create_dm(api, namespace, example())

    def ready():
        dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM)
        c = condition(dm, "Ready")
        return dm if c and c["status"] == "True" else None

    eventually(ready, 120, "Ready")
    # The pass that wrote Ready may still be being counted: wait until a converged pass shows on the page.
    page = eventually(
        lambda: (p := samples(op.scrape()))
        and total(p, "arbiter_operator_reconcile_total", result="converged") >= 1
        and p,
        30,
        "a converged reconcile on the metrics page",
    )
    passes = total(page, "arbiter_operator_reconcile_total")
    assert passes >= 2  # at least the first pass (creating children) and the one that saw them serve
    assert total(page, "arbiter_operator_reconcile_duration_seconds_count") == passes
    assert total(page, "arbiter_operator_reconcile_duration_seconds_sum") > 0
    # The reconcile reads and writes through the apiserver: GETs/LISTs, server-side applies (PATCH), Events (POST).
    assert total(page, "arbiter_operator_kube_requests_total", verb="GET", code="2xx") > 0
    assert total(page, "arbiter_operator_kube_requests_total", verb="PATCH", code="2xx") >= 3  # ISVC, runtime, status
    assert total(page, "arbiter_operator_kube_requests_total", verb="POST", code="2xx") >= 1  # an Event
    # Every pass waited in the queue first; nothing is waiting now that the model is converged.
    assert total(page, "arbiter_operator_workqueue_wait_seconds_count") >= passes
    assert total(page, "arbiter_operator_workqueue_depth") == 0
    assert total(page, "arbiter_operator_reconcile_errors_total") == 0
    # The children's watches saw the InferenceService (created, then KServe's status) and the operator's ConfigMap,
    # and counted their bytes.
    assert total(page, "arbiter_operator_watch_events_total", kind="InferenceService") >= 2
    assert total(page, "arbiter_operator_watch_events_total", kind="ConfigMap") >= 1
    assert total(page, "arbiter_operator_watch_bytes_total", kind="InferenceService") > 500

    # Converged means quiet: the counters settle (no passes, no requests) until something changes.
    def quiet():
        first = samples(op.scrape())
        time.sleep(3)
        second = samples(op.scrape())
        names = ("arbiter_operator_reconcile_total", "arbiter_operator_kube_requests_total")
        return all(total(first, n) == total(second, n) for n in names)

    eventually(quiet, 60, "no reconcile or API request while converged")


_record = st.fixed_dictionaries(
    {
        "version": st.sampled_from(["1.0.0", "1.1.0", "2.0.0"]),
        "startedAt": st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"]),
        "finishedAt": st.sampled_from(["2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z"]),
        "outcome": st.sampled_from(["Succeeded", "RolledBack", "Aborted"]),
    }
)
_hostile_status = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries({"promotion": st.one_of(st.none(), st.just({}), st.fixed_dictionaries(
        {"history": st.one_of(st.none(), st.lists(st.one_of(_record, st.none(), st.integers(), st.text()), max_size=6))}
    ))}),
)


@settings(max_examples=200, deadline=None)
@given(_hostile_status, st.lists(_record, max_size=5))
def test_promotion_outcomes_counts_each_new_record_once(old, added):
    old_hist = [r for r in (((old or {}).get("promotion") or {}).get("history") or []) if isinstance(r, dict)]
    new = {"promotion": {"history": old_hist + added}}
    outcomes = metrics.new_promotion_outcomes(old, new)
    keys = {(r["version"], r["startedAt"], r["finishedAt"]) for r in old_hist}
    assert outcomes == [r["outcome"] for r in added if (r["version"], r["startedAt"], r["finishedAt"]) not in keys]
    # The same status seen again (a later pass, no new promotion) counts nothing.
    assert metrics.new_promotion_outcomes(new, new) == []
    # Hostile shapes on either side never raise.
    assert metrics.new_promotion_outcomes(new, old) == []


def test_work_queue_reports_depth_and_wait():
    async def run() -> None:
        q = WorkQueue()
        waits = metrics.QUEUE_WAIT_SECONDS.collect()[0]
        count = next(s.value for s in waits.samples if s.name.endswith("_count"))
        q.add(("ns", "a"))
        q.add(("ns", "b"))
        q.add(("ns", "a"))  # deduplicated
        assert metrics.QUEUE_DEPTH._value.get() == 2
        await asyncio.sleep(0.05)
        key = await q.get()
        assert metrics.QUEUE_DEPTH._value.get() == 1
        waits = metrics.QUEUE_WAIT_SECONDS.collect()[0]
        assert next(s.value for s in waits.samples if s.name.endswith("_count")) == count + 1
        assert next(s.value for s in waits.samples if s.name.endswith("_sum")) >= 0.05
        q.done(key)
        await q.get()
        assert metrics.QUEUE_DEPTH._value.get() == 0

    asyncio.run(run())
