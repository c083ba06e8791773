from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.governance_kit import Governed


@pytest.fixture
def governed(control_plane: Any, namespace: str, s3_server: Any, tmp_path: Any) -> Iterator[Governed]:
    """One DecisionModel's world (support/governance_kit.py): the real operator watching a fresh namespace, the
    artifacts on S3, the predictor ServiceAccount allowed to review callers; the versions' decision servers are
    started by the test."""
    g = Governed(control_plane, namespace, s3_server, tmp_path)
    g.operator.start()
    try:
        yield g
    finally:
        g.close()
