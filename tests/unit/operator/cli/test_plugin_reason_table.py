"""diagnose's copy of the operator's reason tables is docs/operations.md's, row for row (the generator makes it; this
fails on drift), and holds the reasons a model that does not serve or promote carries."""

from __future__ import annotations

import json

from arbiter_devenv import reason_table
from arbiter_operator.cli.diagnose.command import reason_table as shipped
from support.paths import REPO


def test_the_shipped_copy_is_the_docs_table():
    (path, text), = reason_table.render().items()
    assert (REPO / path).read_text() == text, "run: python -m arbiter_devenv.reason_table"
    assert json.loads(text)["rows"] == shipped()


def test_it_holds_what_a_stuck_model_says():
    reasons = {row["reason"] for row in shipped()}
    assert {"InvalidSpec", "NoReadyVersion", "Unschedulable", "CrashLoopBackOff", "ChildConflict", "AnalysisFailed",
            "ProgressDeadlineExceeded", "CandidateFailed", "RouteNotAdmitted"} <= reasons
    assert all(row["todo"] for row in shipped())
