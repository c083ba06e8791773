from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from arbiter_devenv.operator_process import OperatorProcess


@pytest.fixture
def operator_process(control_plane: Any) -> Iterator[Any]:
    """Factory: operator_process(kubeconfig=None, namespaces=[...], env=..., extra_args=...) -> OperatorProcess.

    Each call starts `python -m arbiter_operator` watching only the given namespaces (tests in one session must not
    reconcile each other's DecisionModels); all are stopped at teardown.
    """
    started: list[OperatorProcess] = []

    def start(kubeconfig: Any = None, namespaces: list[str] | tuple[str, ...] = (), **kw: Any) -> OperatorProcess:
        op = OperatorProcess(kubeconfig or control_plane.kubeconfig, list(namespaces), **kw).start()
        started.append(op)
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()


@pytest.fixture
def model_storage(s3_server: Any, control_plane: Any, namespace: str) -> Any:
    """Artifacts for examples/ on the real S3 server, and the namespace's storage-config Secret."""
    from support.operator_kit import seed_model_storage

    api = control_plane.api_client()
    try:
        seed_model_storage(s3_server, api, namespace)
    finally:
        api.close()
    return s3_server


class Predictors:
    """Steers the simulated predictor pods of one namespace (kwok Stages): ``set_fate(isvc, fate)`` with fate
    ready (default) | loading | crashloop | oom. KServe's controller, the scheduler and kwok do the rest."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def set_fate(self, isvc: str, fate: str) -> None:
        self.cluster.set_fate(self.namespace, isvc, fate)


@pytest.fixture
def predictors(control_plane: Any, namespace: str, model_storage: Any) -> Predictors:
    # Every test that expects a version to serve needs its artifacts on storage first (the operator checks them).
    return Predictors(control_plane, namespace)


@pytest.fixture
def api(control_plane: Any) -> Iterator[Any]:
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()
