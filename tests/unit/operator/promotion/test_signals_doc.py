"""docs/operations.md's table "Transient and permanent signals" is what plan/signals.py decides: every phrase the
table names gets the verdict and reason of its row, every phrase the code looks for is in the table, and the answers
to a child write (no answer, the status codes) are judged as the table says."""

from __future__ import annotations

import re

from arbiter_operator.plan.predictors import FAILED_CREATE
from arbiter_operator.plan.signals import (
    APISERVER_UNAVAILABLE,
    OUTAGES,
    REFUSED_PHRASES,
    Verdict,
    classify_message,
    classify_status,
)
from arbiter_operator.plan.writes import CHILD_WRITE_REFUSED
from support.paths import REPO

NOT_PHRASES = {"FailedCreate", "ReplicaFailure"}


def _rows() -> list[list[str]]:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("### Transient and permanent signals", 1)[1].split("\n###", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in section.splitlines() if line.startswith("| ")]
    assert rows[0][0] == "signal" and len(rows) > 5
    return rows[1:]


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _transient(row: list[str]) -> bool:
    assert row[2].startswith(("transient", "permanent")), row
    return row[2].startswith("transient")


def test_every_phrase_of_the_table_gets_its_rows_verdict_and_the_code_looks_for_no_other():
    named: set[str] = set()
    for row in (r for r in _rows() if "ReplicaFailure" in r[1]):
        (reason,) = _ticked(row[3])
        want = Verdict(reason, _transient(row))
        for phrase in (p for p in _ticked(row[0]) if p not in NOT_PHRASES):
            named.add(phrase.lower())
            message = f'Error creating: pods "credit-limit--1-1-0-predictor-7c9" {phrase}'
            assert classify_message(message, FAILED_CREATE) == want, (phrase, row)
    looked_for = set(REFUSED_PHRASES) | {p for phrases, _ in OUTAGES for p in phrases}
    assert named == looked_for, {"in the table only": named - looked_for, "in the code only": looked_for - named}


def _codes(cell: str) -> set[int | None]:
    out: set[int | None] = {None} if "no answer" in cell else set()
    for n in re.findall(r"\b([45])xx\b", cell):
        out |= set(range(int(n) * 100, int(n) * 100 + 100))
    return out | {int(n) for n in re.findall(r"\b(\d{3})\b", cell)}


def test_the_answers_to_a_child_write_are_judged_as_the_table_says():
    writes = [r for r in _rows() if "child write" in r[1]]
    (refused,) = [r for r in writes if not _transient(r)]
    (unanswered,) = [r for r in writes if _transient(r)]
    assert _ticked(refused[3]) == [CHILD_WRITE_REFUSED]
    assert APISERVER_UNAVAILABLE in _ticked(unanswered[3])
    outage = _codes(unanswered[0])
    assert {None, 408, 429, 500, 503} <= outage
    for code in outage:
        assert classify_status(code, "", CHILD_WRITE_REFUSED) == Verdict(APISERVER_UNAVAILABLE, True), code
    for code in _codes(refused[0]) - outage:
        assert classify_status(code, "", CHILD_WRITE_REFUSED) == Verdict(CHILD_WRITE_REFUSED, False), code
    # "any answer that `denied the request` (even as 500)": the refusal's words outweigh the code
    (words,) = [p for p in _ticked(refused[0]) if p in REFUSED_PHRASES]
    for code in outage:
        said = f'admission webhook "validation.example.com" {words}: no'
        assert classify_status(code, said, CHILD_WRITE_REFUSED) == Verdict(CHILD_WRITE_REFUSED, False), code
