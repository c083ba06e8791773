"""What `status --timeout` waits for, on statuses the operator's real planner wrote: done once the version the spec
names is stable and Ready, failed once Stalled or aborted, still moving otherwise (never done on a status for an
older generation). `list` shows phase, active, candidate, weight and Ready."""

from __future__ import annotations

import copy
import io
from datetime import timedelta

from arbiter_operator.cli.cluster import EXIT_DEGRADED, EXIT_OK
from arbiter_operator.cli.printing import one_line, print_list, summary
from arbiter_operator.cli.status_cmds import settled
from support.plannerdrive import Driver, candidate_ready, failing_canary, two_versions


def promoted() -> Driver:
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}],
                        analysis={"intervalSeconds": 30, "minRequests": 50}, rollbackWindowSeconds=0)
    for _ in range(4):
        d.now += timedelta(seconds=60)
        d.reconcile(0, d.analysis(0.05, 0, 500))
    return d


def test_done_once_the_wanted_version_is_stable_and_ready():
    d = promoted()
    assert d.body["status"]["promotion"]["stable"] == "1.1.0", d.body["status"]["promotion"]
    code, why = settled(d.body)
    assert code == EXIT_OK and "1.1.0 is promoted" in why


def test_still_moving_while_the_canary_runs():
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    code, why = settled(d.body)
    assert code is None and "Progressing" in why
    assert one_line(d.body) == "Progressing, active 1.0.0, candidate 1.1.0 at 10%, Ready=False (Progressing)"


def test_failed_once_rolled_back():
    d, _ = failing_canary()
    assert settled(d.body)[0] == EXIT_DEGRADED  # rolling back: Stalled already
    d.reconcile(1)
    code, why = settled(d.body)
    assert code == EXIT_DEGRADED and "AnalysisFailed" in why


def test_a_status_for_an_older_generation_is_never_done():
    d = promoted()
    body = copy.deepcopy(d.body)
    body["metadata"]["generation"] += 1
    code, why = settled(body)
    assert code is None and "not processed generation" in why


def test_an_aborted_promotion_fails_the_wait():
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    body = copy.deepcopy(d.body)
    body["status"]["promotion"]["phase"] = "Aborted"
    body["status"]["conditions"] = [c for c in body["status"]["conditions"] if c["type"] != "Stalled"]
    assert settled(body)[0] == EXIT_DEGRADED


def test_list_shows_each_model_s_promotion():
    idle = Driver(two_versions())
    idle.reconcile()
    idle.set_ready("1.0.0")
    idle.reconcile(5)
    running = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}])
    running.body["metadata"]["name"] = "fraud"
    out = io.StringIO()
    print_list([idle.body, running.body], out, all_namespaces=True)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "ACTIVE", "CANDIDATE", "WEIGHT", "READY", "REASON"]
    assert lines[1].split() == ["team", "credit-limit", "Idle", "1.0.0", "-", "-", "True", "Promoted"]
    assert lines[2].split() == ["team", "fraud", "Progressing", "1.0.0", "1.1.0", "10%", "False", "Progressing"]
    assert summary(running.body)["weight"] == 10
