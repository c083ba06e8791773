"""`kubectl arbiter lint` says what the real apiserver says: for every bad spec the CRD rejects, lint's offline verdict
is the apiserver's list of causes, field and message, word for word; the shipped examples pass both."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from arbiter_operator.cli.kubectl_arbiter import main
from arbiter_operator.cli.lint import lint_one
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.bad_specs import CASES
from support.examples import EXAMPLES, example
from support.operator_kit import create_dm

pytestmark = pytest.mark.cluster
G, V, P = "arbiter.dev", "v1alpha1", "decisionmodels"


def apiserver_causes(api, namespace: str, body: dict) -> list[str]:
    """`<field>: <message>` of each cause in the apiserver's refusal (asserts it refused)."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, P, body)
    except ApiException as exc:
        assert exc.status == 422, exc.body
        causes = (json.loads(exc.body).get("details") or {}).get("causes") or []
        return [f"{c.get('field')}: {c.get('message')}" for c in causes]
    raise AssertionError("the apiserver accepted it")


@pytest.fixture(scope="module")
def api(control_plane):
    api = control_plane.api_client()
    yield api
    api.close()


def test_lint_refuses_every_bad_spec_with_the_apiserver_s_own_causes(api, namespace):
    differ = {}
    for case in sorted(CASES):
        body = CASES[case][0](example())
        expected = sorted(apiserver_causes(api, namespace, body))
        found = sorted(lint_one(body, "x.yaml", namespace).apiserver)
        if found != expected:
            differ[case] = {"apiserver": expected, "lint": found}
    assert not differ, json.dumps(differ, indent=1)


def test_the_shipped_examples_pass_lint_and_the_apiserver(api, namespace, tmp_path):
    paths = sorted(EXAMPLES.glob("*.yaml"))
    out = io.StringIO()
    assert main(["lint", "-n", namespace, *map(str, paths)], out=out) == 0, out.getvalue()
    for i, path in enumerate(paths):
        body = yaml.safe_load(path.read_text())
        body["metadata"]["name"] = f"example-{i}"
        create_dm(api, namespace, body)
