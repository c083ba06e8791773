"""GitOps for real: Argo CD's own application controller and repo server sync a DecisionModel from a Git repository,
judge it with the health check users install in argocd-cm, and self-heal, while the real operator runs promotions
on the local cluster (KServe's controller, kwok's simulated predictor pods, a real Prometheus scraping stand-ins).

What a user watching the Application would notice is asserted: sync status, health and its message, the sync
history (how many syncs ran, for which commit), and that the DecisionModel is not written by anyone once converged.
"""

from __future__ import annotations

import copy
import io
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from arbiter_devenv.argocd import ArgoCD, GitRepo
from arbiter_operator.cli import kubectl_arbiter as plugin
from support.e2e_kit import E2E, V1, V2, fast_canary
from support.examples import example, example_text
from support.paths import REPO
from support.promstack import module_stack

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
]

ROOT = REPO
NAME = "credit-limit"  # the example's name
FOLDER = "models"


stack = module_stack()


@pytest.fixture(scope="module")
def argocd(control_plane, tmp_path_factory):
    argo = ArgoCD(control_plane, workdir=tmp_path_factory.mktemp("argocd"),
                  log_level=os.environ.get("ARBITER_ARGOCD_LOGLEVEL", "info"))
    try:
        yield argo.start()
    finally:
        argo.stop()


class GitOps:
    """One team: a Git repository with a folder of manifests, an Application syncing it into the test namespace, and
    the operator watching that namespace."""

    def __init__(self, e2e: E2E, argo: ArgoCD, repo: GitRepo, app: str) -> None:
        self.e, self.argo, self.repo, self.app = e2e, argo, repo, app
        self.commits: list[str] = []

    def commit(self, manifest: str, message: str) -> str:
        sha = self.repo.commit({f"{FOLDER}/decisionmodel.yaml": manifest}, message)
        self.commits.append(sha)
        # What a Git webhook does after a push: compare with Git now rather than at the next poll.
        if len(self.commits) > 1:
            self.argo.refresh(self.app)
        return sha

    def status(self) -> dict[str, Any]:
        return self.argo.application(self.app).get("status") or {}

    def dm_health(self, status: dict[str, Any] | None = None) -> dict[str, Any]:
        status = status if status is not None else self.status()
        for res in status.get("resources") or []:
            if res.get("kind") == "DecisionModel" and res.get("name") == NAME:
                return res.get("health") or {}
        return {}

    def synced_at(self, sha: str) -> Callable[[], Any]:
        def check() -> Any:
            s = self.status()
            return s.get("sync", {}).get("status") == "Synced" and s["sync"].get("revision") == sha and s
        return check

    def syncs(self) -> list[str]:
        """Every sync operation Argo CD started for this app, oldest first, as the messages of its OperationStarted
        events (e.g. "Initiated automated sync to '<sha>'"). The Application's history is not enough: a self-heal that
        re-applies only the drifted resources is a partial sync, which Argo CD leaves out of the history."""
        from kubernetes import client

        api = self.e.cp.api_client()
        try:
            events = client.CoreV1Api(api).list_namespaced_event(
                self.argo.namespace, field_selector=f"involvedObject.name={self.app},reason=OperationStarted").items
        finally:
            api.close()
        return [ev.message for ev in sorted(events, key=lambda ev: ev.metadata.creation_timestamp)]

    def history(self) -> list[str]:
        """The revisions of the full syncs in the Application's history, oldest first."""
        return [h["revision"] for h in self.status().get("history") or []]

    def only_commits_synced(self, *shas: str) -> bool:
        """Every sync Argo CD ran was for one of these commits, and each commit got exactly one full sync (the
        history). Right after a commit's sync, Argo CD 3.1 may start a second, partial sync of the same revision that
        re-applies nothing (its diff cache still holds the pre-sync comparison; it happens with a plain ConfigMap
        too), so the events of one commit may number two; `settled()` waits for that to be over."""
        wanted = {f"Initiated automated sync to '{sha}'" for sha in shas}
        return set(self.syncs()) == wanted and self.history() == list(shas)

    def settled(self, sha: str, quiet: float = 3.0) -> int:
        """Wait until the commit is synced and no sync operation has started for `quiet` seconds; returns how many
        sync operations Argo CD has started so far."""
        self.wait(self.synced_at(sha), f"Synced at {sha[:8]}")
        count, since = len(self.syncs()), time.monotonic()
        while time.monotonic() - since < quiet:
            time.sleep(0.5)
            now = len(self.syncs())
            if now != count or (self.status().get("operationState") or {}).get("phase") == "Running":
                count, since = now, time.monotonic()
        return count

    def wait(self, pred: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        try:
            return self.e.wait(pred, what, timeout)
        except AssertionError as exc:
            tail = "\n".join(self.argo.log().splitlines()[-25:])
            raise AssertionError(f"{exc}\nApplication status: {self.status()}\nargocd controller log tail:\n{tail}") \
                from None


@pytest.fixture
def gitops(control_plane, namespace, stack, tmp_path, s3_server, argocd):
    e = E2E(control_plane, namespace, stack, tmp_path, s3_server, name=NAME)
    for v in (V1, V2):
        e.pods[v] = stack.add_workload(namespace, NAME, v)
        e.pods[v].control(rps=40, latency_ms=40, error_rate=0.0)
    e.set_state(V1, "ready")
    e.set_state(V2, "ready")
    # Where the Applications are: a promotion's history names the revision Argo CD synced (docs/argocd.md).
    e.operator.env["ARBITER_ARGOCD_NAMESPACE"] = argocd.namespace
    e.start_operator()
    repo = GitRepo(tmp_path / "git")
    app = f"app-{namespace}"
    g = GitOps(e, argocd, repo, app)
    try:
        yield g
    finally:
        argocd.delete_application(app)
        e.close()


def with_candidate(promote_version: str, **promote: Any) -> str:
    """The example with a second version, 1.1.0, and `spec.promote` as given: what a release commit looks like."""
    body = example()
    v2 = copy.deepcopy(body["spec"]["versions"][0])
    v2["name"] = V2
    v2["storageUri"] = v2["storageUri"].replace(V1, V2)
    body["spec"]["versions"].append(v2)
    body["spec"]["promote"] = {"version": promote_version, **promote}
    return yaml.safe_dump(body, sort_keys=False)


def converge_on_example(g: GitOps) -> str:
    """Commit the example verbatim; Argo CD syncs it, and the app turns Healthy once the operator says Ready."""
    sha = g.commit(example_text(), "credit-limit 1.0.0")
    g.argo.create_application(g.app, g.repo.url, FOLDER, namespace=g.e.ns)
    g.wait(g.synced_at(sha), "Synced at the first commit")
    s = g.wait(lambda: g.status().get("health", {}).get("status") == "Healthy" and g.status(), "app Healthy")
    dm = g.e.dm()
    ready = g.e.condition("Ready", dm)
    assert ready["status"] == "True", (ready, dm.get("status"))  # Healthy only once the operator says Ready
    assert dm["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"].startswith(f"{g.app}:arbiter.dev/")
    assert g.dm_health(s)["status"] == "Healthy"
    assert g.only_commits_synced(sha), (g.syncs(), g.history())
    assert dm["metadata"]["generation"] == 1  # the spec was written once: by the sync of the commit
    return sha


def test_example_syncs_healthy_without_drift_then_a_canary_commit_promotes(gitops: GitOps):
    g, e = gitops, gitops.e
    first = converge_on_example(g)

    # Converged: nobody writes the DecisionModel, and Argo CD (even after a hard refresh, which re-reads Git and the
    # live object) sees no difference: no drift from CRD defaults, managed fields or annotations.
    syncs = g.settled(first)
    rv = e.dm()["metadata"]["resourceVersion"]
    writes = len(e.operator.writes())
    g.argo.refresh(g.app, hard=True)
    seen = set()
    deadline = time.monotonic() + 20  # a measured window: nothing but Synced/Healthy may be seen in it
    while time.monotonic() < deadline:
        s = g.status()
        seen.add((s["sync"]["status"], s["health"]["status"]))
        time.sleep(0.5)
    assert seen == {("Synced", "Healthy")}
    assert "argocd.argoproj.io/refresh" not in g.argo.application(g.app)["metadata"].get("annotations", {})
    assert e.dm()["metadata"]["resourceVersion"] == rv and len(e.operator.writes()) == writes
    assert len(g.syncs()) == syncs

    # A release is a commit: 1.1.0 added and promoted by canary.
    started = time.monotonic()
    release = g.commit(with_candidate(V2, **fast_canary()), "credit-limit 1.1.0 by canary")
    g.wait(g.synced_at(release), "Synced at the release commit", timeout=60)
    synced_s = time.monotonic() - started
    syncs = g.settled(release)
    progressing = g.wait(lambda: g.dm_health().get("status") == "Progressing" and g.dm_health(),
                         "Argo CD shows the canary Progressing")
    writes = len(e.operator.writes())
    e.wait(lambda: e.promotion().get("stable") == V2 and e.condition("Ready")["status"] == "True",
           "the operator says Ready on 1.1.0", timeout=180)
    ready_s = time.monotonic() - started
    health = g.wait(lambda: g.status()["health"]["status"] == "Healthy" and g.dm_health()["status"] == "Healthy",
                    "app Healthy on 1.1.0", timeout=60)
    healthy_s = time.monotonic() - started
    assert health and progressing["status"] == "Progressing"
    assert e.route_weights() == {V2: 100}
    p = e.promotion()
    assert p["history"][-1]["outcome"] == "Succeeded" and p["previous"] == V1
    # Who asked, in the history: Argo CD's field manager, the commit it synced, the spec's generation; the first
    # deployment's record names the first commit.
    first_rec, release_rec = p["history"][-2], p["history"][-1]
    assert (release_rec["requestedBy"], release_rec["revision"], release_rec["generation"]) == (
        "argocd-controller", release, 2), release_rec
    assert (first_rec["version"], first_rec["revision"], first_rec["generation"]) == (V1, first, 1), first_rec
    # Self-heal is on, yet the operator's status writes through the canary (steps, analyses, the switch) never
    # started a sync: one full sync per commit, no sync since the release commit's settled, the spec written twice.
    assert len(e.operator.writes()) - writes >= 5
    assert len(g.syncs()) == syncs and g.only_commits_synced(first, release), (g.syncs(), g.history())
    assert e.dm()["metadata"]["generation"] == 2
    assert g.status()["sync"]["status"] == "Synced"
    # A figure for docs/benchmarks.md (run with -s), not a timed assertion.
    print(f"\nargocd: commit -> Synced {synced_s:.1f}s, -> operator Ready {ready_s:.1f}s, -> app Healthy "
          f"{healthy_s:.1f}s (canary: 2 steps held {fast_canary()['steps'][0]['holdSeconds']}s each)")

    # The plugin refuses to edit an object Argo CD tracks, and prints the Git change instead; nothing changes.
    out = io.StringIO()
    code = plugin.main(["--kubeconfig", str(e.cp.kubeconfig), "-n", e.ns, "promote", NAME, V1], out=out)
    assert code == plugin.EXIT_GITOPS
    text = out.getvalue()
    assert "managed by Argo CD" in text and f'-   version: "{V2}"' in text and f'+   version: "{V1}"' in text
    assert e.dm()["spec"]["promote"]["version"] == V2 and len(g.syncs()) == syncs


def test_a_failing_release_ends_degraded_naming_the_stable_version(gitops: GitOps):
    g, e = gitops, gitops.e
    # Steps without holdSeconds: the CRD defaults a field inside list items (the apiserver stores 300 in each).
    canary = fast_canary(steps=[{"weight": 10}, {"weight": 50}])
    first = g.commit(with_candidate(V1, **canary), "credit-limit 1.0.0, 1.1.0 staged")
    # Server-side apply here (docs/install.md recommends it for the chart's Application); client-side in the test above.
    # With server-side apply but Argo CD's default (client-side) diff, a list whose items the CRD defaults is drift:
    # the app stays OutOfSync and self-heal re-applies the same commit again and again.
    g.argo.create_application(g.app, g.repo.url, FOLDER, namespace=e.ns, sync_options=["ServerSideApply=true"])
    g.wait(lambda: g.status().get("sync", {}).get("status") == "OutOfSync" and len(g.syncs()) >= 3
           and e.condition("Ready")["status"] == "True", "OutOfSync, self-heal looping")
    # The documented fix: server-side diff, which compares with what the apiserver would store (defaults included).
    # Argo CD reuses its cached diff while the live object is unchanged: a hard refresh makes it compare anew.
    g.argo.annotate(g.app, "argocd.argoproj.io/compare-options", "ServerSideDiff=true")
    g.argo.refresh(g.app, hard=True)
    g.wait(lambda: g.synced_at(first)() and g.status()["health"]["status"] == "Healthy", "Synced and Healthy")
    assert e.condition("Ready")["status"] == "True"
    dm = e.dm()
    assert [step.get("holdSeconds") for step in dm["spec"]["promote"]["steps"]] == [300, 300]
    assert "argocd-controller" in {f["manager"] for f in dm["metadata"]["managedFields"] if f["operation"] == "Apply"}
    assert g.settled(first) and g.status()["sync"]["status"] == "Synced"

    e.pods[V2].control(error_rate=0.3)  # 1.1.0 answers 30% errors: the canary's analysis fails
    release = g.commit(with_candidate(V2, **canary), "credit-limit 1.1.0 by canary")  # fails at step 1's analysis
    g.wait(g.synced_at(release), "Synced at the release commit", timeout=60)
    g.wait(lambda: g.dm_health().get("status") == "Progressing", "canary Progressing")
    syncs = g.settled(release)
    health = g.wait(lambda: g.dm_health().get("status") == "Degraded" and g.dm_health(), "Degraded", timeout=180)
    assert g.status()["health"]["status"] == "Degraded"
    # Degraded as soon as the analysis fails (traffic is already back on 1.0.0 while 1.1.0 is being stopped) ...
    message = health["message"]
    assert message.startswith("AnalysisFailed: ") and V2 in message and "error rate above maxErrorRate" in message
    assert message.endswith(f"stable version {V1} keeps serving")
    assert e.route_weights() == {V1: 100}
    # ... and still once the candidate is gone. (Argo CD re-reads a resource's health message on a status-only update
    # only when the health status changes; otherwise at its next periodic refresh.)
    e.wait(lambda: e.promotion().get("phase") == "Failed" and set(e.isvcs()) == {V1}, "candidate stopped")
    refreshed = [0.0]

    def rolled_back():
        health = g.dm_health()
        if health.get("message", "").startswith(f"AnalysisFailed: promotion of {V2} failed and was rolled back"):
            return health
        # A refresh that reaches the controller before its watch delivered the final status reads the old one:
        # ask again every few seconds, as a user clicking Refresh would.
        if time.monotonic() - refreshed[0] > 5:
            g.argo.refresh(g.app)
            refreshed[0] = time.monotonic()
        return None

    health = g.wait(rolled_back, "health message of the finished rollback", timeout=60)
    assert health["status"] == "Degraded" and health["message"].endswith(f"stable version {V1} keeps serving")
    # Degraded is not drift: the spec in Git and in the cluster agree, and self-heal does not retry the sync.
    time.sleep(5)  # a measured wait: self-heal must not start a sync in this time
    assert g.status()["sync"]["status"] == "Synced"
    assert len(g.syncs()) == syncs and g.only_commits_synced(first, release), (g.syncs(), g.history())
    assert e.dm()["metadata"]["generation"] == 2
