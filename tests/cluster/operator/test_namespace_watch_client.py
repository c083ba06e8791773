"""The operator's own namespace list/watch client (kube/namespaces.py) on the real kube-apiserver: the wire format it
parses defensively is the one the apiserver speaks (a label- or field-selected list, chunked watch events), and both
loops built on it follow real label changes: a shard's `run_shard` takes a namespace labelled in and lets it go when
labelled out; `NamespaceWatch` holds the new labels and queues the namespace's DecisionModels. The same loops against
a hostile peer: tests/unit/operator/test_namespace_watches_hostile.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid

import pytest
from arbiter_operator.api.backoff import DoublingBackoff
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.client import new_api_client
from arbiter_operator.kube.namespaces import Failed, WatchOptions, list_namespaces, watch_namespaces
from arbiter_operator.kube.shard import run_shard
from arbiter_operator.nswatch import NamespaceWatch
from kubernetes import client
from support.polling import eventually

LABEL = "arbiter.dev/test-nswatch"
OPTIONS = WatchOptions(timeout_seconds=5, read_timeout=10, healthy_after=1.0, backoff=DoublingBackoff(0.2, 1.0))


def _delete(core, name):
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def test_list_and_watch_on_the_real_apiserver(control_plane, namespace):
    api = control_plane.api_client()
    try:
        found, rv = list_namespaces(api, [("fieldSelector", f"metadata.name={namespace}")], OPTIONS)
        assert set(found) == {namespace} and found[namespace].labels.get("arbiter.dev/test") == "true"
        assert rv.isdigit()
        found, _ = list_namespaces(api, [("labelSelector", f"{LABEL}={uuid.uuid4().hex[:8]}")], OPTIONS)
        assert found == {}
        # A watch from no resourceVersion starts with the state (ADDED), and the apiserver ends it at its timeout.
        events = list(watch_namespaces(api, [("fieldSelector", f"metadata.name={namespace}")], "",
                                       dataclasses.replace(OPTIONS, timeout_seconds=1)))
        assert [(e.type, e.namespace.name) for e in events if e.namespace] == [("ADDED", namespace)]
        assert all(e.resource_version.isdigit() for e in events)  # bookmarks too (allowWatchBookmarks)
    finally:
        api.close()


def test_a_service_account_token_is_sent_and_a_refusal_is_named(control_plane, namespace, tmp_path):
    """With a token kubeconfig (how the operator runs in a pod) the request carries the token: the apiserver's 403
    names the ServiceAccount (anonymous would be named instead), and the failure says so."""
    admin = control_plane.api_client()
    try:
        core = client.CoreV1Api(admin)
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="no-grants")))
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[],
                                                                                   expiration_seconds=600))
        token = core.create_namespaced_service_account_token("no-grants", namespace, request).status.token
    finally:
        admin.close()
    api = new_api_client(str(control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token)))
    try:
        with pytest.raises(Failed, match=rf"HTTP 403 .*system:serviceaccount:{namespace}:no-grants"):
            list_namespaces(api, [("fieldSelector", f"metadata.name={namespace}")], OPTIONS)
    finally:
        api.close()


class _Idle(logging.Handler):
    """Records the shard's wait while no namespace matches (run_shard logs it; no run is started) as an empty run."""

    def __init__(self, history: list[list[str]]) -> None:
        super().__init__(logging.WARNING)
        self.history = history

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("no namespace matches"):
            self.history.append([])


def test_shard_and_label_watch_follow_real_label_changes(control_plane, namespace):
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    run = uuid.uuid4().hex[:8]
    history: list[list[str]] = []  # each run's namespaces; [] for the wait while none matches
    finish = threading.Event()

    def kopf_run(watched: list[str], stop: threading.Event) -> None:  # stands for the kopf run: records its namespaces
        history.append(list(watched))
        while not (stop.is_set() or finish.is_set()):
            stop.wait(0.05)

    idle = _Idle(history)
    logging.getLogger("arbiter.shard").addHandler(idle)
    shard = threading.Thread(target=run_shard, args=(control_plane.api_client(), f"{LABEL}={run}", kopf_run, None),
                             kwargs={"options": OPTIONS}, daemon=True)
    queued: list[tuple[str, str]] = []
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    cache = WatchCache()
    labels = NamespaceWatch(control_plane.api_client(), queued.append, loop, cache=cache, options=OPTIONS)
    other = f"t-{run}-in"
    try:
        core.patch_namespace(namespace, {"metadata": {"labels": {LABEL: run}}})
        shard.start()
        eventually(lambda: history == [[namespace]], 30, "the shard running on the labelled namespace")
        labels.note(namespace, "credit-limit")
        eventually(lambda: _labels(cache, namespace).get(LABEL) == run, 30, "the namespace's labels held")

        core.patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}})
        eventually(lambda: queued == [(namespace, "credit-limit")], 30, "the DecisionModel queued on the mesh label")
        assert _labels(cache, namespace).get("istio-injection") == "enabled"
        assert history == [[namespace]]  # an owned namespace relabelled within the shard: no restart

        core.patch_namespace(namespace, {"metadata": {"labels": {LABEL: "elsewhere"}}})
        eventually(lambda: history == [[namespace], []], 30, "the shard letting the namespace go")
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other, labels={LABEL: run})))
        eventually(lambda: history == [[namespace], [], [other]], 30, "the shard taking up a namespace created so")
        assert shard.is_alive()
    finally:
        finish.set()  # the run ends, and with it run_shard (the set did not change)
        shard.join(30)
        labels.stop()
        loop.call_soon_threadsafe(loop.stop)
        logging.getLogger("arbiter.shard").removeHandler(idle)
        _delete(core, other)
        api.close()
    assert not shard.is_alive()


def _labels(cache: WatchCache, namespace: str) -> dict[str, str]:
    return ((cache.get("v1", "Namespace", None, namespace) or {}).get("metadata") or {}).get("labels") or {}
