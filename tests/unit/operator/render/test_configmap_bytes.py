"""decision.json's bytes never change for the same content: the pods' config checksum is taken over them, so a
different encoding would restart every predictor on an operator upgrade."""

from __future__ import annotations

import json

from arbiter_operator.render.configmap import readable_json
from hypothesis import given, settings
from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(value=json_values)
def test_the_text_is_exactly_the_standard_librarys_sorted_indented_json(value):
    assert readable_json(value) == json.dumps(value, sort_keys=True, indent=2)
    assert readable_json(value) == json.dumps(value, sort_keys=True, indent=2)  # the second time from memory
