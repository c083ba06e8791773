"""The per-DecisionModel state series: what an SRE graphs and alerts on, made from status at scrape time."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from typing import Any

from arbiter_operator.state_metrics import DecisionModelStateCollector
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def _dm(name: str = "credit-limit", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "arbiter.dev/v1alpha1", "kind": "DecisionModel",
        "metadata": {"namespace": "team-a", "name": name},
        "spec": {"promote": {"version": "1.1.0", "strategy": "Canary"}, "serving": {"gpus": 2, "replicas": 3}},
        "status": status,
    }


MID_CANARY = _dm(
    conditions=[{"type": "Ready", "status": "True"}, {"type": "Reconciling", "status": "True"},
                {"type": "Stalled", "status": "False"}],
    versions=[{"name": "1.0.0", "phase": "Ready", "inferenceService": "credit-limit--1-0-0"},
              {"name": "1.1.0", "phase": "Ready", "inferenceService": "credit-limit--1-1-0"},
              {"name": "0.9.0", "phase": "Stopped"}],
    promotion={
        "phase": "Progressing", "stable": "1.0.0", "candidate": "1.1.0", "step": 1, "weight": 50,
        "startedAt": "2026-12-01T10:00:00Z",
        "lastAnalysis": {"at": "2026-12-01T10:05:00Z", "step": 1, "verdict": "Fail", "checks": [
            {"name": "fallbackRate", "value": 0.3, "bound": 0.05, "direction": "max", "verdict": "Fail"},
            {"name": "shadowAgreement", "bound": 0.95, "direction": "min", "verdict": "NoData"}]},
        "history": [
            {"version": "0.9.0", "outcome": "Succeeded", "startedAt": "2026-11-01T10:00:00Z",
             "finishedAt": "2026-11-01T11:00:00Z", "durationSeconds": 3600},
            {"version": "1.1.0", "outcome": "RolledBack", "startedAt": "2026-11-20T10:00:00Z",
             "finishedAt": "2026-11-20T10:30:00Z", "durationSeconds": 1800},
            {"version": "1.1.0", "outcome": "RolledBack", "startedAt": "2026-11-21T10:00:00Z",
             "finishedAt": "2026-11-21T10:30:00Z", "durationSeconds": 1800},
        ],
    },
)


def scrape(models: list[dict[str, Any]], leading: bool = True) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = CollectorRegistry()
    registry.register(DecisionModelStateCollector(lambda: models, lambda: leading))
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                  if k not in ("decisionmodel_namespace", "decisionmodel")))
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def test_a_model_mid_canary_shows_its_phase_split_gates_and_gpus():
    m = scrape([MID_CANARY])
    assert m["arbiter_decisionmodel_info"] == {
        (("candidate", "1.1.0"), ("stable", "1.0.0"), ("strategy", "Canary")): 1.0}
    assert m["arbiter_decisionmodel_phase"] == {(("phase", "Progressing"),): 1.0}
    assert m["arbiter_decisionmodel_traffic_weight"] == {(("version", "1.0.0"),): 50.0, (("version", "1.1.0"),): 50.0}
    assert m["arbiter_decisionmodel_promotion_step"] == {(): 1.0}
    assert m["arbiter_decisionmodel_promotion_started_timestamp_seconds"] == {(): _t("2026-12-01T10:00:00")}
    assert m["arbiter_decisionmodel_condition"][(("status", "True"), ("type", "Ready"))] == 1.0
    assert m["arbiter_decisionmodel_condition"][(("status", "False"), ("type", "Stalled"))] == 1.0
    assert m["arbiter_decisionmodel_analysis"] == {(("verdict", "Fail"),): 1.0}
    # A gate without data has a bound and no value: a panel shows the bound alone, not a made-up zero.
    assert m["arbiter_decisionmodel_gate_value"] == {(("gate", "fallbackRate"),): 0.3}
    assert m["arbiter_decisionmodel_gate_bound"] == {(("direction", "max"), ("gate", "fallbackRate")): 0.05,
                                                     (("direction", "min"), ("gate", "shadowAgreement")): 0.95}
    # The latest finish per outcome, from the capped history.
    assert m["arbiter_decisionmodel_promotion_last_finished_timestamp_seconds"] == {
        (("outcome", "RolledBack"),): _t("2026-11-21T10:30:00"), (("outcome", "Succeeded"),): _t("2026-11-01T11:00:00")}
    # Two versions hold pods (2 GPUs x 3 replicas each); the stopped one holds none.
    assert m["arbiter_decisionmodel_gpus"] == {(("version", "1.0.0"),): 6.0, (("version", "1.1.0"),): 6.0}


def test_an_idle_model_sends_all_traffic_to_stable_and_has_no_running_promotion():
    idle = _dm(promotion={"phase": "Idle", "stable": "1.0.0", "step": -1, "weight": 0,
                          "startedAt": "2026-12-01T10:00:00Z"})
    m = scrape([idle])
    assert m["arbiter_decisionmodel_traffic_weight"] == {(("version", "1.0.0"),): 100.0}
    assert "arbiter_decisionmodel_promotion_started_timestamp_seconds" not in m
    assert m["arbiter_decisionmodel_promotion_step"] == {(): -1.0}


def test_a_standby_exports_no_model_series():
    m = scrape([MID_CANARY], leading=False)
    assert not any(name.startswith("arbiter_decisionmodel_") and name != "arbiter_decisionmodel_state_scrape_seconds"
                   for name in m)


def test_a_deleted_model_is_gone_at_the_next_scrape():
    models = [MID_CANARY, _dm("fraud")]
    assert len(scrape(models)["arbiter_decisionmodel_info"]) == 2
    models.pop()
    assert len(scrape(models)["arbiter_decisionmodel_info"]) == 1


def test_build_info_names_the_release():
    from arbiter_operator import metrics

    text = generate_latest().decode()
    assert f'arbiter_build_info{{python_version="{platform.python_version()}",version="{metrics.RELEASE}"}} 1.0' in text


def test_the_release_is_the_packages_version():
    import tomllib

    from arbiter_operator import metrics
    from support.paths import REPO

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == metrics.RELEASE


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(status=st.dictionaries(st.sampled_from(["conditions", "promotion", "versions", "x"]), _junk, max_size=4),
       spec=_junk)
def test_a_model_with_any_status_never_breaks_the_scrape(status, spec):
    """Whatever a stand-in or an older operator left in status, the scrape answers (and keeps the other model)."""
    odd = {"metadata": {"namespace": "team-a", "name": "odd"}, "spec": spec, "status": status}
    m = scrape([odd, MID_CANARY])
    assert len(m["arbiter_decisionmodel_info"]) == 2
