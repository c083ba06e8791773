"""The operator's namespace watches (kube/watch.py's list/watch on Namespaces, cluster-scoped) on the real
kube-apiserver: the wire format it parses defensively is the one the apiserver speaks (a label- or field-selected
list, chunked watch events), and both loops built on it follow real label changes: a shard's `run_shard` takes a
namespace labelled in and lets it go when labelled out; `NamespaceLabels` holds the new labels and queues the
namespace's DecisionModels. The same loops against a hostile peer:
tests/unit/operator/test_namespace_watches_hostile.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable

import pytest
from arbiter_operator.api.backoff import DoublingBackoff
from arbiter_operator.kube.cache import WatchCache
from arbiter_operator.kube.client import new_api_client
from arbiter_operator.kube.namespaces import NamespaceLabels
from arbiter_operator.kube.shard import run_shard
from arbiter_operator.kube.watch import Failed, Watches, WatchOptions, namespaces
from kubernetes import client

LABEL = "arbiter.dev/test-nswatch"
OPTIONS = WatchOptions(timeout_seconds=5, read_timeout=10, healthy_after=1.0, relist_after=1,
                       backoff=DoublingBackoff(0.2, 1.0))


def _delete(core, name):
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as exc:
        if exc.status != 404:
            raise


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _ignore(*_):
    return None


def test_list_and_watch_on_the_real_apiserver(control_plane, namespace):
    one = namespaces(field_selector=f"metadata.name={namespace}")

    async def main() -> None:
        watches = Watches(control_plane.api_client().configuration, [], [], _ignore, _ignore,
                          dataclasses.replace(OPTIONS, timeout_seconds=1)).start()
        try:
            found, rv = await watches._list(one, None)
            assert [o["metadata"]["name"] for o in found] == [namespace]
            assert found[0]["metadata"]["labels"].get("arbiter.dev/test") == "true"
            assert rv.isdigit()
            none, _ = await watches._list(namespaces(selector=f"{LABEL}={uuid.uuid4().hex[:8]}"), None)
            assert none == []
            # A watch from no resourceVersion starts with the state (ADDED), and the apiserver ends it at its timeout.
            events = [e async for e in watches._watch(one, None, "")]
            assert [(t, o["metadata"]["name"]) for t, o, _ in events if o] == [("ADDED", namespace)]
            assert all(rv.isdigit() for _, _, rv in events)  # bookmarks too (allowWatchBookmarks)
        finally:
            await watches.stop()

    asyncio.run(main())


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
    config = new_api_client(str(control_plane.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token))).configuration

    async def main() -> None:
        watches = Watches(config, [], [], _ignore, _ignore, OPTIONS).start()
        try:
            with pytest.raises(Failed, match=rf"HTTP 403 .*system:serviceaccount:{namespace}:no-grants"):
                await watches._list(namespaces(field_selector=f"metadata.name={namespace}"), None)
        finally:
            await watches.stop()

    asyncio.run(main())


def test_shard_and_label_watch_follow_real_label_changes(control_plane, namespace):
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    run = uuid.uuid4().hex[:8]
    history: list[list[str]] = []  # each run's namespaces; [] for the idle run while none matches
    other = f"t-{run}-in"

    async def main() -> None:
        finish = asyncio.Event()

        async def kopf_run(watched: list[str], stop: asyncio.Event) -> None:  # stands for the kopf run
            history.append(list(watched))
            while not (stop.is_set() or finish.is_set()):
                await asyncio.sleep(0.05)

        queued: list[tuple[str, str]] = []
        cache = WatchCache()
        config = control_plane.api_client().configuration
        labels = NamespaceLabels(config, queued.append, cache=cache, options=OPTIONS).start()
        core.patch_namespace(namespace, {"metadata": {"labels": {LABEL: run}}})
        shard = asyncio.create_task(run_shard(config, f"{LABEL}={run}", kopf_run, options=OPTIONS))
        try:
            await _until(lambda: history == [[namespace]], 30, "the shard running on the labelled namespace")
            labels.note(namespace, "credit-limit")
            await _until(lambda: _labels(cache, namespace).get(LABEL) == run, 30, "the namespace's labels held")

            core.patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}})
            await _until(lambda: queued == [(namespace, "credit-limit")], 30,
                         "the DecisionModel queued on the mesh label")
            assert _labels(cache, namespace).get("istio-injection") == "enabled"
            assert history == [[namespace]]  # an owned namespace relabelled within the shard: no restart

            core.patch_namespace(namespace, {"metadata": {"labels": {LABEL: "elsewhere"}}})
            await _until(lambda: history == [[namespace], []], 30, "the shard letting the namespace go")
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other, labels={LABEL: run})))
            await _until(lambda: history == [[namespace], [], [other]], 30,
                         "the shard taking up a namespace created so")
            assert not shard.done()
        finally:
            finish.set()  # the run ends, and with it run_shard (the set did not change)
            await asyncio.wait_for(shard, 30)
            await labels.stop()

    try:
        asyncio.run(main())
    finally:
        _delete(core, other)
        api.close()


def _labels(cache: WatchCache, namespace: str) -> dict[str, str]:
    return ((cache.get("v1", "Namespace", None, namespace) or {}).get("metadata") or {}).get("labels") or {}
