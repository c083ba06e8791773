"""The kinds table (kube/kinds.py) and the child kinds a reconcile observes (observe/children.py CHILD_KINDS) agree.
Two tables because the finders name children with the renderers' name functions and the `when` rules read the
DecisionModel's phase: reconcile policy, above the wire floor the kinds table sits on.

What a user would notice if they drifted apart: a child kind without a row fails every reconcile at its first read
(`kind_of` raises), and a child read by name that is not watched with the operator's label costs a GET per child
per pass instead of an answer from the watch cache."""

from __future__ import annotations

from arbiter_operator.api.names import LABEL_DM
from arbiter_operator.kube import kinds
from arbiter_operator.observe.children import CHILD_KINDS, ByName


def test_every_child_kind_has_a_row():
    missing = [f"{c.api_version}/{c.kind}" for c in CHILD_KINDS if (c.api_version, c.kind) not in kinds.KINDS]
    assert missing == []


def test_a_child_read_by_name_is_answered_from_the_watch_cache():
    by_name = [c for c in CHILD_KINDS if isinstance(c.find, ByName)]
    assert by_name  # the check below judges something
    unwatched = [c.kind for c in by_name if kinds.CACHED.get((c.api_version, c.kind), "-") != LABEL_DM]
    assert unwatched == []


def test_every_kind_is_declared_once():
    rows = [(k.api_version, k.kind) for k in kinds.TABLE]
    assert len(rows) == len(set(rows)) == len(kinds.KINDS)
    assert len({(k.api_version, k.plural) for k in kinds.TABLE}) == len(rows)
