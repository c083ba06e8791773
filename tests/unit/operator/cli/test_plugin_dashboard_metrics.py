"""The model page's numbers as read from Prometheus answers: a share of decisions never reads over 100%."""

from __future__ import annotations

from typing import Any

from arbiter_operator.cli.dashboard.metrics import VERSION, model_metrics


class Answers:
    """Prometheus as the page queries it, answering from a table of metric name -> rows."""

    def __init__(self, rows: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        self.rows = rows

    def vector(self, query: str) -> list[tuple[dict[str, str], float]]:
        return next((r for name, r in self.rows.items() if name in query and "histogram_quantile" not in query), [])

    def matrix(self, query: str, start: float, end: float, step: float) -> list[Any]:
        return []


def test_an_all_fallback_version_reads_100_percent_when_the_two_increases_extrapolate_apart() -> None:
    # increase() extrapolates each series from its own samples: the fallbacks can read a hair over the decisions.
    prom = Answers({
        "arbiter_fallbacks_total": [({VERSION: "1.1.0", "reason": "upstream_error"}, 100.2),
                                    ({VERSION: "1.0.0", "reason": "deadline"}, 3.0)],
        "increase(arbiter_decisions_total": [({VERSION: "1.1.0"}, 100.0), ({VERSION: "1.0.0"}, 300.0)],
    })
    m = model_metrics(prom, ("fraud", "claims"), None, 300, 0.0)  # type: ignore[arg-type]
    assert m.fallbacks == {"1.1.0": {"upstream_error": 1.0}, "1.0.0": {"deadline": 0.01}}
