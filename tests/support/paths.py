"""Where the repository is, for tests that read its files (one constant, so moving a test breaks nothing)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
