"""The dashboard's pages from the store, without a server: a promotion that rolls back shows its phases in order, the
weights at each step and the failing gate marked (in words, not only colour); names are escaped; hostile objects
and events still give a page; the overview of 200 models renders in milliseconds."""

from __future__ import annotations

import copy
import time
from datetime import timedelta
from html.parser import HTMLParser

from arbiter_operator.cli.dashboard.render import model_page, overview
from arbiter_operator.cli.dashboard.store import ModelMetrics, Store, event_key
from hypothesis import given, settings
from hypothesis import strategies as st
from support.plannerdrive import candidate_ready

KEY = ("team", "credit-limit")


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text, of a page."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.text.append(data)

    def having(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        def fits(a: dict[str, str]) -> bool:
            return all(v in a.get(k.rstrip("_"), "").split() for k, v in attrs.items())

        return [a for t, a in self.tags if t == tag and fits(a)]


def rollback_store() -> tuple[Store, float]:
    """The operator's planner through a two-step canary whose second analysis fails, put into a store a minute apart
    each, as the watch would have delivered them."""
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}, {"weight": 50, "holdSeconds": 60}],
                        analysis={"intervalSeconds": 30, "minRequests": 50})
    snaps = [copy.deepcopy(d.body)]
    d.now += timedelta(seconds=60)
    snaps.append(copy.deepcopy(d.reconcile(0, d.analysis(0.05, 0, 500))))
    d.now += timedelta(seconds=60)
    snaps.append(copy.deepcopy(d.reconcile(0, d.analysis(0.4, 0, 500))))
    snaps.append(copy.deepcopy(d.reconcile(1)))
    store, t0 = Store(), time.time() - 600
    for i, body in enumerate(snaps):
        store.put(body, t0 + 60 * i)
    return store, t0


def test_a_rollback_shows_phases_weights_and_the_failing_gate():
    store, _ = rollback_store()
    store.set_metrics(KEY, ModelMetrics(at=time.time(), mix={"1.1.0": {"approved": 0.7, "rejected": 0.2,
                                                                       "review": 0.1}},
                                        fallbacks={"1.1.0": {"upstream_error": 0.3}}, latency={"1.1.0": (0.05, 0.4)},
                                        rate={"1.1.0": 2.0}))
    page = Elements(model_page(KEY, store.snapshot(KEY), time.time(), prometheus=True))
    phases = [a["data-phase"] for a in page.having("rect", class_="phase")]
    assert phases == ["Progressing", "Progressing", "RollingBack", "Failed"]
    assert [a["data-version"] for a in page.having("polyline", class_="weight")] == ["1.0.0", "1.1.0"]
    text = " ".join(page.text)
    assert "1.0.0 90%, 1.1.0 10%" in text and "1.0.0 50%, 1.1.0 50%" in text and "1.0.0 100%" in text
    failing = page.having("tr", class_="fail")
    assert [a["data-gate"] for a in failing] == ["p95LatencyMs"]
    assert "✗ Fail" in text and "AnalysisFailed" in text
    assert "upstream_error 30.0%" in text and "400 ms" in text  # fallbacks and p99 of the candidate
    assert page.having("svg", role="img")  # every picture is an image with a title


def test_without_prometheus_the_page_says_how_to_get_the_numbers():
    store, _ = rollback_store()
    text = " ".join(Elements(model_page(KEY, store.snapshot(KEY), time.time(), prometheus=False)).text)
    assert "--prometheus URL" in text


def test_names_and_messages_are_escaped():
    store, _ = rollback_store()
    body = copy.deepcopy(store.snapshot(KEY)["model"])
    body["metadata"]["name"] = "<script>alert(1)</script>"
    body["status"]["conditions"][0]["message"] = "<img src=x onerror=alert(1)>"
    store.put(body, time.time())
    html = overview(store.snapshot(), time.time())
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    key = ("team", body["metadata"]["name"])
    assert "<img src=x" not in model_page(key, store.snapshot(key), time.time(), False)


def test_events_are_kept_per_model_by_their_object():
    store, _ = rollback_store()
    models = set(store.snapshot()["models"])
    assert event_key({"involvedObject": {"namespace": "team", "name": "credit-limit--1-1-0-predictor-x"}},
                     models) == KEY
    assert event_key({"involvedObject": {"namespace": "team", "name": "other"}}, models) is None
    store.add_event({"metadata": {"uid": "u1"}, "type": "Warning", "reason": "BackOff", "message": "crash",
                     "involvedObject": {"namespace": "team", "name": "credit-limit--1-1-0", "kind": "Pod"}})
    text = " ".join(Elements(model_page(KEY, store.snapshot(KEY), time.time(), False)).text)
    assert "BackOff" in text and "crash" in text


def test_the_overview_of_200_models_renders_at_once():
    store, _ = rollback_store()
    base = store.snapshot(KEY)["model"]
    for i in range(200):
        body = copy.deepcopy(base)
        body["metadata"]["name"] = f"model-{i:03d}"
        store.put(body, time.time())
    started = time.perf_counter()
    html = overview(store.snapshot(), time.time())
    elapsed = time.perf_counter() - started  # a few ms (benchmarks/dashboard_page.py); loose for a loaded machine
    assert len(Elements(html).having("tr")) == 202  # the header, credit-limit and the 200
    assert elapsed < 0.5, elapsed


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                           st.text(max_size=6), lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.sampled_from(["phase", "stable", "candidate", "weight", "conditions",
                                                            "type", "status", "checks", "value", "bound",
                                                            "verdict", "history", "lastAnalysis", "promotion",
                                                            "labels", "decision"]), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(status=json_values, spec=json_values)
def test_hostile_objects_still_give_a_page(status, spec):
    store = Store()
    body = {"metadata": {"namespace": "team", "name": "credit-limit"},
            "spec": spec if isinstance(spec, dict) else {}, "status": status if isinstance(status, dict) else {}}
    store.put(body, time.time())
    assert "<main" in model_page(KEY, store.snapshot(KEY), time.time(), True)
    assert "<main" in overview(store.snapshot(), time.time())
