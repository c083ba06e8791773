"""Reads from the watch cache, on the real apiserver: a reconcile reads nothing the watches already hold, the echo of
the operator's own write queues no second pass, a deleted PodMonitor is repaired, and converged models cost no
request at all. Plus the cache against hostile watch streams (out of order, garbage resourceVersions) and its label
selectors checked against the apiserver's own answers."""

from __future__ import annotations

import time
import uuid

from arbiter_operator.kube.cache import CachedKubeClient, WatchCache, _requirements, matches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from support.kubekit import raw_call
from support.operator_kit import condition, create_dm, eventually, example, get
from test_operator_metrics import samples, total

DM = "credit-limit"


def _ready(api, ns, name=DM):
    dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", ns, name)
    c = condition(dm, "Ready") if dm else None
    ok = c and c["status"] == "True" and condition(dm, "Reconciling")["status"] == "False"
    return dm if ok and dm["status"].get("observedGeneration") == dm["metadata"]["generation"] else None


def _settled(op, seconds=3.0):
    """The operator's counters (passes, requests, echoes) once they stopped moving for `seconds`."""
    def still():
        first = samples(op.scrape())
        time.sleep(seconds)
        second = samples(op.scrape())
        names = ("arbiter_operator_reconcile_total", "arbiter_operator_kube_requests_total",
                 "arbiter_operator_workqueue_depth")
        return second if all(total(first, n) == total(second, n) for n in names) else None
    return eventually(still, 90, "the operator's counters settle")


def _requests(page, verb=None):
    return total(page, "arbiter_operator_kube_requests_total", **({"verb": verb} if verb else {}))


def _passes(page):
    return total(page, "arbiter_operator_reconcile_total")


def test_a_reconcile_reads_from_the_watch_cache_and_skips_its_own_echoes(
    control_plane, namespace, api, operator_process, predictors
):
    op = operator_process(namespaces=[namespace], metrics=True)
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 120, "Ready")
    page = _settled(op)

    # A change that asks for a reconcile and no write (a label on the DecisionModel): one pass, not one request.
    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", DM,
                                          {"metadata": {"labels": {"team": "credit"}}})
    after = eventually(lambda: (p := _settled(op)) and _passes(p) > _passes(page) and p, 60,
                       "a reconcile pass")
    assert _passes(after) == _passes(page) + 1
    assert _requests(after) == _requests(page), "the pass read (or wrote) through the apiserver"

    # Someone edits the Route: the operator puts it back with one write, and the watch event of that write (its
    # echo) queues no second pass.
    before = after
    custom.patch_namespaced_custom_object("route.openshift.io", "v1", namespace, "routes", DM,
                                          {"spec": {"to": {"kind": "Service", "name": "elsewhere", "weight": 100}}})
    eventually(lambda: get(api, "route.openshift.io/v1", "routes", namespace, DM)["spec"]["to"]["name"] != "elsewhere",
               30, "Route restored")
    after = _settled(op)
    assert _requests(after, "PATCH") == _requests(before, "PATCH") + 1  # the Route's apply, nothing else
    assert _requests(after) == _requests(before) + 1
    echoes = "arbiter_operator_watch_echoes_skipped_total"
    assert total(after, echoes) >= total(before, echoes) + 1  # the apply's watch event queued nothing
    # One pass for the edit; a second one only if the cluster itself moved meanwhile (KServe's controller, say).
    assert _passes(before) + 1 <= _passes(after) <= _passes(before) + 2


def test_a_deleted_podmonitor_is_put_back(control_plane, namespace, api, operator_process, predictors):
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 120, "Ready")
    old = get(api, "monitoring.coreos.com/v1", "podmonitors", namespace, DM)
    client.CustomObjectsApi(api).delete_namespaced_custom_object("monitoring.coreos.com", "v1", namespace,
                                                                 "podmonitors", DM)
    back = eventually(lambda: (p := get(api, "monitoring.coreos.com/v1", "podmonitors", namespace, DM))
                      and p["metadata"]["uid"] != old["metadata"]["uid"] and p, 30, "PodMonitor back")
    assert back["spec"] == old["spec"]


_WATCHED = (("serving.kserve.io", "v1beta1", "inferenceservices"), ("apps", "v1", "deployments"),
            ("", "v1", "configmaps"), ("", "v1", "services"), ("", "v1", "pods"),
            ("route.openshift.io", "v1", "routes"), ("serving.kserve.io", "v1alpha1", "servingruntimes"),
            ("monitoring.coreos.com", "v1", "podmonitors"), ("arbiter.dev", "v1alpha1", "decisionmodels"))


def _cluster_state(api, ns):
    """(plural, name) -> resourceVersion of everything in the namespace whose change may queue a reconcile."""
    state = {}
    for group, version, plural in _WATCHED:
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        for obj in raw_call(api, "GET", f"{prefix}/namespaces/{ns}/{plural}")["items"]:
            state[(plural, obj["metadata"]["name"])] = obj["metadata"]["resourceVersion"]
    return state


def _quiet_window(op, api, ns, seconds):
    """The operator's counters at both ends of a `seconds` window in which nothing it watches in `ns` changed (a
    window in which the cluster moved is tried again: a pass answering a change is the operator's job)."""
    def window():
        first, cluster = _settled(op), _cluster_state(api, ns)
        time.sleep(seconds)
        second = samples(op.scrape())
        return (first, second) if _cluster_state(api, ns) == cluster else None

    return eventually(window, 10 * seconds, f"a {seconds} s window in which the cluster did not move")


def test_converged_models_make_no_requests(control_plane, namespace, api, operator_process, predictors):
    """Idle cost with a fleet: 20 converged DecisionModels, then 30 s without one reconcile or API request.

    KServe's controller may still be catching up on its own status after the operator went quiet (slowly on a busy
    machine); a pass that answers such a change is the operator's job, not idle cost. So a window counts only when
    nothing the operator watches changed in it, and a window where the cluster moved is measured again."""
    op = operator_process(namespaces=[namespace], metrics=True)
    names = [f"idle-{i:02d}" for i in range(20)]
    for name in names:
        body = example()
        body["metadata"]["name"] = name
        create_dm(api, namespace, body)
    eventually(lambda: all(_ready(api, namespace, n) for n in names), 240, "all 20 Ready")

    first, second = _quiet_window(op, api, namespace, 30)
    reconciles = "arbiter_operator_reconcile_total"
    by_result = {r: total(second, reconciles, result=r) - total(first, reconciles, result=r)
                 for r in ("converged", "requeued", "error")}
    assert _passes(second) == _passes(first), f"a converged fleet reconciled with nothing changed: {by_result}"
    assert _requests(second) == _requests(first), "a converged fleet made API requests"


# -- the cache against hostile watch streams ---------------------------------------------------------------------

_rv = st.one_of(st.integers(min_value=0, max_value=50).map(str), st.sampled_from(["", "abc", None, "-1", "1e3"]))
_obj = st.tuples(st.sampled_from([("v1", "ConfigMap"), ("serving.kserve.io/v1beta1", "InferenceService")]),
                 st.fixed_dictionaries({
        "name": st.sampled_from(["a", "b"]),
        "namespace": st.sampled_from(["ns1", "ns2"]),
        "resourceVersion": _rv,
        "labels": st.dictionaries(st.sampled_from(["x", "y"]), st.sampled_from(["1", "2"]), max_size=2),
    })).map(lambda t: {"apiVersion": t[0][0], "kind": t[0][1], "metadata": t[1]})
_events = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "delete", "wrote"]), _obj), max_size=30)


def _int(rv):
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


@settings(max_examples=300, deadline=None)
@given(_events)
def test_the_cache_never_goes_back_to_an_older_object(events):
    cache = WatchCache({("v1", "ConfigMap"): None, ("serving.kserve.io/v1beta1", "InferenceService"): None})
    model: dict = {}
    for op, obj in events:
        m = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], m["namespace"], m["name"])
        if op == "delete":
            cache.discard(*key)
            model.pop(key, None)
            continue
        (cache.put if op == "put" else cache.wrote)(obj)
        held = model.get(key)
        a, b = _int(m["resourceVersion"]), _int(held and held["metadata"]["resourceVersion"])
        # Newer replaces what is held; the same resourceVersion is the same object, so the one held stays.
        if held is None or a is None or b is None or a > b:
            model[key] = obj
        if op == "wrote":  # its watch event is an echo, whichever copy of that resourceVersion is held
            assert cache.is_echo(model[key]) == (a is not None and _int(model[key]["metadata"]["resourceVersion"]) == a)
    for key, obj in model.items():
        assert cache.get(*key) == obj
    for api_version, kind in (("v1", "ConfigMap"), ("serving.kserve.io/v1beta1", "InferenceService")):
        for ns in ("ns1", "ns2"):
            want = sorted((o for k, o in model.items() if k[:3] == (api_version, kind, ns)),
                          key=lambda o: o["metadata"]["name"])
            assert cache.list(api_version, kind, ns, []) == want


_key = st.sampled_from(["arbiter.dev/decision-model", "app", "tier"])
_val = st.sampled_from(["a", "b", "c-1"])
_req = st.one_of(
    st.tuples(_key, st.sampled_from(["=", "==", "!="]), _val).map(lambda t: f"{t[0]}{t[1]}{t[2]}"),
    st.tuples(_key, st.sampled_from(["in", "notin"]), st.lists(_val, min_size=1, max_size=3, unique=True))
    .map(lambda t: f"{t[0]} {t[1]} ({','.join(t[2])})"),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_req, min_size=1, max_size=3))
def test_label_selectors_match_as_the_apiserver_does(control_plane, namespace, api, reqs):
    """The cache answers LISTs by label selector: for every selector form the operator sends, its answer is the
    apiserver's."""
    core = client.CoreV1Api(api)
    if not core.list_namespaced_config_map(namespace, label_selector="sel-test=1").items:
        for i, labels in enumerate([{}, {"app": "a"}, {"app": "b", "tier": "c-1"}, {"arbiter.dev/decision-model": "a"},
                                    {"arbiter.dev/decision-model": "b", "app": "c-1", "tier": "a"}]):
            core.create_namespaced_config_map(namespace, {"metadata": {"name": f"sel-{i}",
                                                                       "labels": {"sel-test": "1", **labels}}})
    selector = ",".join(["sel-test=1", *reqs])
    live = sorted(o.metadata.name for o in core.list_namespaced_config_map(namespace, label_selector=selector).items)
    parsed = _requirements(selector)
    assert parsed is not None
    objs = core.list_namespaced_config_map(namespace, label_selector="sel-test=1").items
    ours = sorted(o.metadata.name for o in objs if matches(o.metadata.labels or {}, parsed))
    assert ours == live, selector


async def test_a_list_the_cache_cannot_answer_goes_to_the_apiserver(control_plane, namespace, api):
    """A selector the cache's watch does not filter on (objects without the operator's label are not held) is
    answered by the apiserver, and so is a get of an object the cache does not hold."""
    from arbiter_operator.kube.client import RestKubeClient

    name = f"plain-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespaced_config_map(namespace, {"metadata": {"name": name,
                                                                                "labels": {"app": "x"}}})
    rest = RestKubeClient(api)
    cached = CachedKubeClient(rest, WatchCache({("v1", "ConfigMap"): "arbiter.dev/decision-model"}))
    assert [o["metadata"]["name"] for o in await cached.alist("v1", "ConfigMap", namespace, "app=x")] == [name]
    assert await cached.alist("v1", "ConfigMap", namespace, "arbiter.dev/decision-model=x") == []  # held: none
    assert (await cached.aget("v1", "ConfigMap", namespace, name))["metadata"]["name"] == name
    assert await cached.aheld("v1", "ConfigMap", namespace, name) is None
    await rest.close()


def test_a_child_whose_label_is_removed_gets_it_back(control_plane, namespace, api, operator_process, predictors):
    """The cache holds children by the operator's label: one whose label someone removed leaves the cache, and the
    reconcile puts the label back (it would otherwise look converged from memory)."""
    operator_process(namespaces=[namespace])
    create_dm(api, namespace, example())
    eventually(lambda: _ready(api, namespace), 120, "Ready")
    cm = "credit-limit--1-0-0-decision"
    client.CoreV1Api(api).patch_namespaced_config_map(
        cm, namespace, [{"op": "remove", "path": "/metadata/labels/arbiter.dev~1decision-model"}])
    eventually(lambda: client.CoreV1Api(api).read_namespaced_config_map(cm, namespace).metadata.labels.get(
        "arbiter.dev/decision-model") == DM, 30, "label restored")


def test_a_loading_version_is_woken_by_its_pods_not_polled(control_plane, namespace, api, operator_process,
                                                            predictors):
    """While a version loads, the operator makes no reconcile pass of its own (no loading poll: at fleet scale it
    was most of the operator's CPU). What decides the outcome is watched: here its pods start crash-looping, and the
    DecisionModel reports the cause well before the slow safety requeue (60 s) could have."""
    from arbiter_operator.api.models import isvc_name

    isvc = isvc_name(DM, "1.0.0")
    op = operator_process(namespaces=[namespace], metrics=True)
    predictors.set_fate(isvc, "loading")
    create_dm(api, namespace, example())

    def waiting():
        dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM)
        return dm if ((dm or {}).get("status") or {}).get("promotion", {}).get("phase") == "Waiting" else None

    eventually(waiting, 90, "the version loading")
    page, quiet = _quiet_window(op, api, namespace, 20)
    assert _passes(quiet) == _passes(page), "a reconcile pass while nothing changed"
    assert _requests(quiet) == _requests(page)

    predictors.set_fate(isvc, "crashloop")
    started = time.monotonic()

    def reported(failed: bool):
        def check():  # an AssertionError is "not yet", and the last one says what the status showed
            dm = get(api, "arbiter.dev/v1alpha1", "decisionmodels", namespace, DM)
            serving, stalled = condition(dm, "Serving"), condition(dm, "Stalled")
            if failed:
                assert stalled["status"] == "True" and "restarted" in stalled["message"], dm["status"]
            else:
                assert serving["reason"] == "CrashLoopBackOff", dm["status"]
            return dm
        return check

    # The cause, as the pods show it, on Serving: noticed from the pod's watch event, not a timer.
    dm = eventually(reported(False), 50, "the crash loop reported")
    assert time.monotonic() - started < 50
    assert "restarted" in condition(dm, "Serving")["message"]
    # Once the kubelet holds it back (CrashLoopBackOff), the version has failed and the rollout stops.
    dm = eventually(reported(True), 120, "the version failed")
    assert condition(dm, "Stalled")["reason"] == "CandidateFailed"


def test_an_echo_that_overtakes_the_writes_answer_is_still_an_echo():
    """The watch event of the operator's own write can arrive before the write's answer (a busy machine): it waits
    for the answer, then is known as the echo and queues no pass; another writer's event in the meantime is not
    mistaken for one, and wakes the DecisionModel."""
    import asyncio
    import threading

    from arbiter_operator import app
    from arbiter_operator.kube.workqueue import PriorityWorkQueue
    from arbiter_operator.render.common import LABEL_DM
    from arbiter_operator.triggers import Triggers

    cache = WatchCache({("v1", "ConfigMap"): LABEL_DM})
    key = ("v1", "ConfigMap", "ns", "cm")
    configmaps = next(r for r in app.WATCHED if r.kind == "ConfigMap")

    def obj(rv):
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "cm", "namespace": "ns", "labels": {LABEL_DM: "dm"}, "resourceVersion": str(rv)}}

    async def queued_after(events, queue, event_rv) -> bool:
        events.event(configmaps, "MODIFIED", obj(event_rv))
        await asyncio.sleep(0.5)  # the late answer (0.2 s) has come
        woken = bool(queue._pending)
        while queue._pending:
            queue.done(await queue.get())
        return woken

    async def run():
        queue = PriorityWorkQueue()
        events = Triggers(queue, cache)
        cache.begin_write(key)
        threading.Timer(0.2, cache.end_write, (key, obj(7))).start()  # the answer, late
        ours = await queued_after(events, queue, 7)
        cache.begin_write(key)
        threading.Timer(0.2, cache.end_write, (key, obj(9))).start()
        theirs = await queued_after(events, queue, 8)  # someone else's, in between
        cache.begin_write(key)
        cache.end_write(key, None)  # a write that failed: nothing is in flight any more
        later = await queued_after(events, queue, 10)
        await events.stop()
        return ours, theirs, later

    assert asyncio.run(run()) == (False, True, True)
    assert not cache.writing(obj(10))
