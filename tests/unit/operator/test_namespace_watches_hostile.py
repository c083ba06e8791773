"""The operator's own namespace watches against a hostile apiserver (support/hostile_apiserver.py, a real HTTP server
on loopback speaking the list/watch wire format): a shard's `run_shard` (which namespaces it owns, kube/shard.py) and
`NamespaceLabels` (the labels of a namespace holding DecisionModels, kube/namespaces.py), both on kube/watch.py's
generic list/watch.

What a user would notice, whatever the peer does for a while (error statuses with or without bodies and Retry-After,
410 Gone, resets, hangs, cut or broken streams, lines that never end, garbage and lying events) and then behaving
again: the operator does not crash or stop following; it owns exactly the matching namespaces (and never owned one
that did not match), the cache holds the namespace's true labels and a label change queues its DecisionModels; it
asks at a bounded rate while the peer misbehaves (a count of requests, not a timing); it stops reading an answer
that never ends. Garbage events on their own change nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from arbiter_operator.api.backoff import DoublingBackoff
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.namespaces import NamespaceLabels
from arbiter_operator.kube.shard import run_shard
from arbiter_operator.kube.watch import NAMESPACE_NAME as NAME
from arbiter_operator.kube.watch import Failed, Gone, Watches, WatchOptions, list_page, namespaces
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from support.hostile_apiserver import ENDS, GARBAGE_LISTS, HONEST, STATUS_BODIES, TRANSPORT, HostileApiserver
from support.polling import eventually

MAX_BYTES = 256 * 1024
# Short: an honest watch lasts a second; silence longer than that (a read timeout past the watch's own) is a fault.
# relist_after=1: the namespace watches' own setting (kube/namespaces.py, kube/shard.py).
OPTIONS = WatchOptions(timeout_seconds=1, connect_timeout=1.0, read_timeout=1.3, list_timeout=2.0,
                       max_page_bytes=MAX_BYTES, max_event_bytes=MAX_BYTES, healthy_after=0.3, relist_after=1,
                       backoff=DoublingBackoff(0.05, 0.2))
HOSTILE_S = 1.0  # how long the peer misbehaves in each example
CONVERGE_S = 15.0  # a bound for "eventually", far above what it takes (about a second)
# What a client that does not bound its reads would have taken: the peer stops at 48 MiB; kernel buffers on loopback
# hold a few MiB that the client never read.
READ_SLACK = 16 << 20
# No shrinking: an example takes seconds, and a failing one is reported as generated (shrinking took minutes).
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])

KEY, MINE, THEIRS = "arbiter.dev/shard", "risk", "fraud"
SELECTOR = f"{KEY}={MINE}"
NAMES = ("risk-a", "risk-b", "credit", "fraud-a", "x" * 63)
DMS = ("credit-limit", "fraud-score")

unicode_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
labels_st = st.dictionaries(unicode_text.filter(lambda k: k != KEY), unicode_text, max_size=3)
mine_st = labels_st.map(lambda d: {**d, KEY: MINE})
theirs_st = st.one_of(labels_st, labels_st.map(lambda d: {**d, KEY: THEIRS}))
truth_st = st.dictionaries(st.sampled_from(NAMES), st.one_of(mine_st, theirs_st), max_size=len(NAMES))
change_st = st.tuples(st.sampled_from((*NAMES, "risk-new")), st.one_of(st.none(), mine_st, theirs_st))


# -- garbage and lies on a watch stream -----------------------------------------------------------------------------
def _line(doc: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | unicode_text,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(unicode_text, inner, max_size=3),
                           max_leaves=8)
not_names = st.one_of(st.sampled_from(["", "\ud800", "Ünïcødé", "UPPER", "a b", "-lead", "x" * 64, "a.b"]),
                      unicode_text.filter(lambda s: not NAME.fullmatch(s)), st.integers(), st.none(), st.booleans(),
                      st.lists(st.integers(), max_size=2))
wrong_labels = st.one_of(unicode_text, st.integers(), st.lists(unicode_text, max_size=2),
                         st.dictionaries(unicode_text, st.one_of(st.integers(), st.none(), st.lists(st.integers())),
                                         min_size=1, max_size=2))
rvs = st.one_of(st.integers(0, 10**12).map(str), unicode_text, st.integers(), st.none())
event_types = st.sampled_from(["ADDED", "MODIFIED", "DELETED"])


def _ns(name: Any, labels: Any, rv: Any) -> dict[str, Any]:
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": name, "labels": labels, "resourceVersion": rv}}


# Lines that are not a well-formed Namespace event: every loop must skip them.
malformed_lines = st.one_of(
    unicode_text.map(lambda s: ("<" + s).replace("\n", " ").encode()),  # not JSON
    st.binary(max_size=20).map(lambda b: b"\xff\xfe" + b.replace(b"\n", b"")),  # not UTF-8
    st.just(b"[" * 50000),  # nested deeper than a parser goes
    json_values.filter(lambda v: not isinstance(v, dict)).map(_line),  # JSON, not an object
    st.builds(lambda o: _line({"object": o}), json_values),  # no type
    st.builds(lambda t, n: _line({"type": t, "object": _ns(n, {}, "1")}),
              st.one_of(st.integers(), st.none(), st.lists(st.just("ADDED"), max_size=1)), st.sampled_from(NAMES)),
    st.builds(lambda t, n: _line({"type": t, "object": _ns(n, {}, "1")}),
              unicode_text.filter(lambda t: t not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")),
              st.sampled_from(NAMES)),  # an unknown type
    st.builds(lambda t: _line({"type": t}), event_types),  # no object
    st.builds(lambda t, o: _line({"type": t, "object": o}), event_types,
              json_values.filter(lambda v: not isinstance(v, dict))),
    st.builds(lambda t, m: _line({"type": t, "object": {"metadata": m}}), event_types,
              json_values.filter(lambda v: not isinstance(v, dict))),
    st.builds(lambda t, n, rv, a: _line({"type": t, "object": _ns(n, {}, rv)}, a), event_types, not_names, rvs,
              st.booleans()),
    st.builds(lambda t, n, lb: _line({"type": t, "object": _ns(n, lb, "7")}), event_types, st.sampled_from(NAMES),
              wrong_labels),
    st.builds(lambda o: _line({"type": "BOOKMARK", "object": o}), json_values),
    st.builds(lambda rv: _line({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}), rvs),
)
# ERROR events (a Status, or not): the watch ends there and the loop lists again.
error_lines = st.builds(lambda code, o: _line({"type": "ERROR", "object": {"kind": "Status", "code": code, **o}}),
                        st.sampled_from([410, 500, 403, 504, "410", None]),
                        st.dictionaries(st.sampled_from(["reason", "message", "status"]), json_values, max_size=2))
# Well-formed events that say what is not so (any name, any labels, any resourceVersion, duplicates, out of order):
# acted on while the peer misbehaves, corrected once it behaves.
lying_lines = st.builds(lambda t, n, lb, rv, a: _line({"type": t, "object": _ns(n, lb, rv)}, a), event_types,
                        st.sampled_from((*NAMES, "risk-new", "zz")), st.one_of(labels_st, mine_st), rvs, st.booleans())
any_line = st.one_of(malformed_lines, error_lines, lying_lines)

behaviours = st.one_of(
    st.just(HONEST),
    st.tuples(st.just("status"), st.sampled_from([400, 401, 403, 404, 410, 429, 500, 502, 503, 504]),
              st.sampled_from(sorted(STATUS_BODIES)),
              st.sampled_from([None, "0", "1", "30", "-3", "abc", "1e9", "inf", "Wed, 21 Oct 2015 07:28:00 GMT"])),
    st.sampled_from(TRANSPORT).map(lambda t: (t,)),
    st.sampled_from(GARBAGE_LISTS).map(lambda b: ("list_body", b)),
    st.tuples(st.just("events"), st.lists(any_line, max_size=6), st.sampled_from(ENDS)),
)
scripts = st.lists(behaviours, min_size=1, max_size=6)


# -- the loops under test -------------------------------------------------------------------------------------------
class Peer:
    def __enter__(self) -> HostileApiserver:
        self.peer = HostileApiserver(hang_s=3.0, huge_line_bytes=MAX_BYTES + 4096).start()
        return self.peer

    def __exit__(self, *exc: Any) -> None:
        self.peer.stop()


class Shard:
    """`run_shard` on an event loop of its own (in a thread of the test's), the kopf run replaced by a recorder of
    the namespaces each run was given ([] for the idle run while none matches)."""

    def __init__(self, peer: HostileApiserver) -> None:
        self.peer = peer
        self.history: list[list[str]] = []  # each run's namespaces
        self.finish = threading.Event()
        self.error: BaseException | None = None
        self.returned = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, daemon=True, name="test-shard")

    async def _run(self, watched: list[str], stop: asyncio.Event) -> None:
        with self._lock:
            self.history.append(list(watched))
        while not (stop.is_set() or self.finish.is_set()):
            await asyncio.sleep(0.02)

    def _main(self) -> None:
        try:
            asyncio.run(run_shard(self.peer.configuration(), SELECTOR, self._run, options=OPTIONS))
        except BaseException as exc:
            self.error = exc
        self.returned = True

    def __enter__(self) -> Shard:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish.set()
        self.peer.go_honest()  # a shard between two runs lists again before its next run (which ends at once)
        self.thread.join(15)
        assert not self.thread.is_alive(), "run_shard did not return"

    def owns(self) -> list[str] | None:
        with self._lock:
            return self.history[-1] if self.history else None

    def healthy(self) -> None:
        assert self.error is None, f"run_shard raised {self.error!r}"
        assert not self.returned and self.thread.is_alive(), "run_shard stopped following"


class Watched:
    """`NamespaceLabels` with one namespace holding two DecisionModels, with the watch cache it fills, on an event
    loop of its own (in a thread of the test's)."""

    NS = "credit"

    def __init__(self, peer: HostileApiserver) -> None:
        self.peer = peer
        self.queued: list[tuple[str, str]] = []
        self.cache = WatchCache()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="test-nswatch-loop")
        self.watch = NamespaceLabels(peer.configuration(), self.queued.append, cache=self.cache, options=OPTIONS)

    def _on_loop(self, fn: Any) -> Any:
        async def call() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def __enter__(self) -> Watched:
        self._loop_thread.start()
        self._on_loop(self.watch.start)
        for dm in DMS:
            self._on_loop(lambda dm=dm: self.watch.note(self.NS, dm))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._on_loop(self.watch.stop)  # cancels the watch's task, wherever it is (a read, a back-off)
        stopped = not self.watch.running(self.NS)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(5)
        self.loop.close()
        assert stopped, "the namespace watch did not stop"

    def labels(self) -> dict[str, str] | None:
        held = self.cache.get("v1", "Namespace", None, self.NS)
        return held["metadata"].get("labels", {}) if held is not None else None

    def healthy(self) -> None:
        assert self.watch.running(self.NS), "the namespace watch stopped following"


def _mine(truth: dict[str, dict[str, str]]) -> list[str]:
    return sorted(n for n, labels in truth.items() if labels.get(KEY) == MINE)


def _hostile_phase(peer: HostileApiserver, script: list[tuple[Any, ...]]) -> int:
    """Misbehave for HOSTILE_S; the requests the peer saw meanwhile."""
    start = time.monotonic()
    peer.set_script(script)
    time.sleep(HOSTILE_S)
    end = time.monotonic()
    return peer.requests_between(start, end)


def _bounded_rate(requests: int, per_attempt: int) -> None:
    # Each attempt (at most `per_attempt` requests) follows a wait of at least the first back-off, or an attempt that
    # lasted `healthy_after`: a loop that spins makes thousands of requests in the same time.
    bound = per_attempt * (HOSTILE_S / min(OPTIONS.backoff.first, OPTIONS.healthy_after) + 3)
    assert requests <= bound, f"{requests} requests in {HOSTILE_S}s of a misbehaving peer (bound {bound:.0f})"


def _bounded_reads(peer: HostileApiserver) -> None:
    for written, capped in peer.endless:
        assert not capped and written <= MAX_BYTES + READ_SLACK, \
            f"the client read on in an answer that never ends ({written} bytes written)"


# -- a shard --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@SETTINGS
@given(first=truth_st, script=scripts, final=truth_st, change=change_st)
@example(first={"risk-a": {KEY: MINE}}, script=[("empty_200",)], final={"risk-a": {KEY: MINE}},
         change=("risk-b", {KEY: MINE})).via("a watch that ends at once is not asked again at once")
@example(first={"risk-a": {KEY: MINE}},
         script=[("events", [b'{"type": "ADDED", "object": {"metadata": {"name": "zz", "resourceVersion": "1"}}}'],
                  "end"), ("status", 503, "none", None)],
         final={"risk-b": {KEY: MINE}}, change=("risk-a", {KEY: MINE})).via("a failed list does not end the process")
@example(first={}, script=[("endless_line",)], final={"risk-a": {KEY: MINE}},
         change=("risk-a", None)).via("a line that never ends is not read to its end")
@example(first={"risk-a": {KEY: MINE}}, script=[("events", [b"[1, 2]", b'{"type": "ADDED"}'], "honest")],
         final={"risk-a": {KEY: MINE}}, change=("credit", {KEY: MINE})).via("JSON that is not an event")
@example(first={"risk-a": {KEY: MINE}}, script=[("status", 410, "status", None)], final={"risk-a": {KEY: MINE}},
         change=("risk-b", {KEY: MINE})).via("410 Gone answered at once, again and again")
def test_a_shard_owns_exactly_the_matching_namespaces_once_a_hostile_apiserver_behaves(first, script, final, change):
    with Peer() as peer:
        peer.set_truth(first)
        with Shard(peer) as shard:
            eventually(lambda: shard.owns() == _mine(first), CONVERGE_S, "the first run", interval=0.02)
            requests = _hostile_phase(peer, script)
            shard.healthy()

            peer.go_honest(final)
            eventually(lambda: shard.owns() == _mine(final), CONVERGE_S, f"owning {_mine(final)}", interval=0.02,
                       check=shard.healthy)
            name, labels = change
            after = {**{n: lb for n, lb in final.items() if n != name}, **({name: labels} if labels else {})}
            peer.put(name, labels)
            eventually(lambda: shard.owns() == _mine(after), CONVERGE_S, f"owning {_mine(after)}", interval=0.02,
                       check=shard.healthy)
            # Never a run on namespaces that did not match: every run had the set of one of the true states.
            assert {tuple(h) for h in shard.history} <= {tuple(_mine(s)) for s in (first, final, after)}
            _bounded_rate(requests, per_attempt=3)  # a list and a watch per attempt, and a list per restart
            _bounded_reads(peer)


def _shard_noops(owned: list[str]) -> st.SearchStrategy[bytes]:
    """Well-formed events that change nothing a shard owns: an owned namespace added again or edited, one it does not
    own deleted (any labels, any resourceVersion, in any order, duplicated)."""
    others = [n for n in NAMES if n not in owned] + ["zz"]
    return st.one_of(
        st.builds(lambda t, n, lb, rv: _line({"type": t, "object": _ns(n, lb, rv)}),
                  st.sampled_from(["ADDED", "MODIFIED"]), st.sampled_from(owned), st.one_of(labels_st, mine_st), rvs)
        if owned else st.nothing(),
        st.builds(lambda n, lb, rv: _line({"type": "DELETED", "object": _ns(n, lb, rv)}), st.sampled_from(others),
                  labels_st, rvs),
    )


@pytest.mark.slow
@SETTINGS
@given(data=st.data(), owned=st.lists(st.sampled_from(NAMES), unique=True, max_size=3).map(sorted))
@example(data=None, owned=["risk-a"]).via("see below")
def test_garbage_events_do_not_restart_a_shard(data, owned):
    if data is None:  # the explicit example: each kind of garbage once
        lines = [b"not json", b"[]", b'"x"', b"{}", b'{"type": 1, "object": {}}', b'{"type": "ADDED", "object": 5}',
                 '{"type": "ADDED", "object": {"metadata": {"name": "Ünï"}}}'.encode(),
                 b'{"type": "ADDED", "object": {"metadata": {"name": "credit", "labels": ["a"]}}}',
                 b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "999999999999"}}}',
                 b'{"type": "WHATEVER", "object": {"metadata": {"name": "credit"}}}',
                 b'{"type": "DELETED", "object": {"metadata": {"name": "credit"}}}',
                 b'{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd is sad"}}']
    else:
        lines = data.draw(st.lists(st.one_of(malformed_lines, error_lines, _shard_noops(owned)), max_size=10))
    with Peer() as peer:
        peer.set_truth({n: {KEY: MINE} for n in owned})
        # The shard's first list is answered honestly, its first watch with the lines, then honestly.
        peer.set_script([HONEST, ("events", lines, "honest")], cycle=False)
        with Shard(peer) as shard:
            assert peer.scripted_lines_sent.wait(CONVERGE_S)
            peer.put("risk-new", {KEY: MINE})
            expected = sorted([*owned, "risk-new"])
            eventually(lambda: shard.owns() == expected, CONVERGE_S, f"owning {expected}", interval=0.02,
                       check=shard.healthy)
            time.sleep(OPTIONS.healthy_after)
            assert shard.history == [owned, expected]  # one restart: for the namespace labelled in, for nothing else


# -- a namespace holding DecisionModels -----------------------------------------------------------------------------
ns_labels_st = st.one_of(st.none(), labels_st, labels_st.map(lambda d: {**d, "istio-injection": "enabled"}))


def _world(labels: dict[str, str] | None, others: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    return {**others, **({Watched.NS: labels} if labels is not None else {})}


others_st = st.dictionaries(st.sampled_from(["risk-a", "fraud-a"]), labels_st, max_size=2)


@pytest.mark.slow
@SETTINGS
@given(first=ns_labels_st, others=others_st, script=scripts, final=ns_labels_st, relabel=labels_st)
@example(first={"a": "1"}, others={}, script=[("empty_200",)], final={"a": "1"},
         relabel={"a": "2"}).via("a watch that ends at once is not asked again at once")
@example(first={"a": "1"}, others={"risk-a": {"istio-injection": "enabled"}},
         script=[("events", [b'{"type": "MODIFIED", "object": {"metadata": {"name": "risk-a", '
                             b'"labels": {"istio-injection": "enabled"}, "resourceVersion": "1"}}}'], "end")],
         final={"a": "1"}, relabel={"a": "2"}).via("the labels of another namespace are not this one's")
@example(first={"a": "1"}, others={},
         script=[("events", [b'{"type": "MODIFIED", "object": {"metadata": {"name": "credit", '
                             b'"labels": {"a": "1"}, "resourceVersion": "99999999999"}}}'], "honest")],
         final={"a": "1"}, relabel={"a": "2"}).via("a resourceVersion from the future does not pin the labels")
@example(first=None, others={}, script=[("hang_after_headers",)], final=None,
         relabel={"b": ""}).via("a watch that goes silent")
def test_a_namespace_watch_holds_the_true_labels_once_a_hostile_apiserver_behaves(first, others, script, final,
                                                                                  relabel):
    with Peer() as peer:
        peer.set_truth(_world(first, others))
        with Watched(peer) as w:
            eventually(lambda: peer.listed_then_watched(0) and w.labels() == first, CONVERGE_S, "the first labels",
                       interval=0.02)
            requests = _hostile_phase(peer, script)
            w.healthy()

            honest = time.monotonic()
            peer.go_honest(_world(final, others))
            eventually(lambda: peer.listed_then_watched(honest) and w.labels() == final, CONVERGE_S,
                       f"labels {final}", interval=0.02, check=w.healthy)
            relabel = relabel if relabel != (final or {}) else {**relabel, "istio.io/rev": "stable"}
            mark = len(w.queued)
            peer.put(Watched.NS, relabel)
            eventually(lambda: w.labels() == relabel and {k for k in w.queued[mark:]} == {(w.NS, d) for d in DMS},
                       CONVERGE_S, "the relabelled namespace's DecisionModels queued", interval=0.02, check=w.healthy)
            assert set(w.queued) <= {(w.NS, d) for d in DMS}  # never a DecisionModel of another namespace
            _bounded_rate(requests, per_attempt=2)
            _bounded_reads(peer)


def _namespace_noops(labels: dict[str, str]) -> st.SearchStrategy[bytes]:
    """Well-formed events that change nothing: other namespaces' events, this one's unchanged labels again (any
    resourceVersion, duplicated, out of order)."""
    return st.one_of(
        st.builds(lambda t, n, lb, rv: _line({"type": t, "object": _ns(n, lb, rv)}), event_types,
                  st.sampled_from(["risk-a", "fraud-a", "zz"]), labels_st, rvs),
        st.builds(lambda t, rv: _line({"type": t, "object": _ns(Watched.NS, labels, rv)}),
                  st.sampled_from(["ADDED", "MODIFIED"]), rvs),
    )


@pytest.mark.slow
@SETTINGS
@given(data=st.data(), labels=labels_st)
def test_garbage_events_do_not_queue_or_change_a_namespace(data, labels):
    lines = data.draw(st.lists(st.one_of(malformed_lines, error_lines, _namespace_noops(labels)), max_size=10))
    with Peer() as peer:
        peer.set_truth({Watched.NS: labels, "risk-a": {"x": "y"}})
        peer.set_script([HONEST, ("events", lines, "honest")], cycle=False)
        with Watched(peer) as w:
            assert peer.scripted_lines_sent.wait(CONVERGE_S)
            relabelled = {**labels, "istio-injection": "enabled" if labels.get("istio-injection") != "enabled" else "x"}
            peer.put(Watched.NS, relabelled)
            eventually(lambda: w.labels() == relabelled and len(w.queued) >= len(DMS), CONVERGE_S,
                       "the relabelled namespace's DecisionModels queued", interval=0.02, check=w.healthy)
            time.sleep(OPTIONS.healthy_after)
            assert sorted(w.queued) == sorted((w.NS, d) for d in DMS)  # queued once, for the true change only


def test_retry_after_is_granted_up_to_the_back_off_cap():
    """429 with Retry-After: the next request waits at least that long (here capped at the back-off's cap), longer
    than the back-off alone would."""
    retry_after = "1"
    with Peer() as peer:
        peer.set_truth({Watched.NS: {"a": "1"}})
        peer.set_script([("status", 429, "status", retry_after)], cycle=False)
        with Watched(peer) as w:
            eventually(lambda: w.labels() == {"a": "1"}, CONVERGE_S, "the labels after the 429", interval=0.02)
            first, second = peer.requests[0][0], peer.requests[1][0]
            assert second - first >= min(float(retry_after), OPTIONS.backoff.cap) * 0.99


# -- the parsers on their own (pure) --------------------------------------------------------------------------------
NAMESPACES = namespaces(selector=SELECTOR)


def _parse_event(line: bytes) -> tuple[str, dict[str, Any] | None, str] | None:
    watches = Watches(k8s.Configuration(host="http://127.0.0.1:9"), [], [], lambda *a: None, lambda *a: None)
    return watches._event(NAMESPACES, None, line)


@settings(max_examples=300, deadline=None)
@given(line=st.one_of(st.binary(max_size=200), malformed_lines, lying_lines, error_lines))
def test_a_watch_line_is_a_well_formed_event_skipped_or_the_end_of_the_watch(line):
    try:
        event = _parse_event(line)
    except Gone:
        assert b'"ERROR"' in line  # an ERROR event, 410 or not, ends the watch: the loop lists again
        return
    if event is None:
        return
    type_, obj, rv = event
    assert type_ in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
    assert isinstance(rv, str)
    if type_ == "BOOKMARK":
        assert obj is None and rv
    else:
        assert obj is not None and NAME.fullmatch(obj["metadata"]["name"])
        labels = obj["metadata"].get("labels") or {}
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(st.binary(max_size=200), st.sampled_from(GARBAGE_LISTS), json_values.map(_line)))
def test_a_list_answer_is_a_namespace_list_or_a_failure(body):
    try:
        found, rv, _ = list_page(NAMESPACES, None, body)
    except Failed:
        return
    assert rv and all(NAME.fullmatch(o["metadata"]["name"]) and o["kind"] == "Namespace" for o in found)


def test_every_garbage_list_of_the_peer_is_refused_as_a_whole():
    # The shard test's "never a run on namespaces that did not match" relies on it: none of these is half-used.
    for body in GARBAGE_LISTS:
        with pytest.raises(Failed):
            list_page(NAMESPACES, None, body)


GONE_EVENT = b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}'


@pytest.mark.parametrize("failure", [
    ("status", 410, "status", None), ("events", [GONE_EVENT], "end"), ("events", [GONE_EVENT], "hang"),
    ("truncated",), ("reset",), ("bad_chunk",), ("status", 500, "none", None), ("status", 401, "html", None),
    ("status", 403, "status", None), ("status", 429, "status", "0"), ("status", 503, "endless", "1"),
    ("empty_200",), ("hang_after_headers",), ("endless_line",), ("huge_line",),
], ids=lambda f: "-".join(str(p) for p in f if not isinstance(p, list)))
def test_a_failed_watch_is_followed_by_a_fresh_list(failure):
    """Whatever ended the watch, the loop lists again (never resumes from a resourceVersion that may be gone), and a
    change made meanwhile is seen."""
    with Peer() as peer:
        peer.set_truth({Watched.NS: {"a": "1"}})
        peer.set_script([HONEST, failure], cycle=False)
        with Watched(peer) as w:
            eventually(lambda: len(peer.requests) >= 2, CONVERGE_S, "the failing watch", interval=0.02)
            peer.put(Watched.NS, {"a": "2"})
            eventually(lambda: w.labels() == {"a": "2"} and len(w.queued) == len(DMS), CONVERGE_S,
                       "the change made while the watch failed", interval=0.02, check=w.healthy)
            kinds = [kind for _, kind, _ in peer.requests]
            assert kinds[:3] == ["list", "watch", "list"], kinds
