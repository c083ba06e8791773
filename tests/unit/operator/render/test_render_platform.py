"""What OpenShift AI expects of the children: the Route's TLS and port follow auth, the runtime is told what its
SubjectAccessReview asks about, and the proxy's identity header is believed only where no sidecar sits in front."""

from __future__ import annotations

from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice, render_route
from support.examples import example
from support.factory import make_dm


def _env(dm, namespace_labels=None) -> dict[str, str]:
    v = dm.spec.versions[0]
    isvc = render_inferenceservice(PredictorInputs(dm, v, render_configmap(dm, v), namespace_labels or {}))
    return {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}


def _with_exposure(**exposure):
    raw = example()
    raw["spec"]["exposure"] = exposure
    return make_dm(raw)


def test_route_reencrypts_to_the_proxy_with_auth_and_goes_to_the_runtime_port_without():
    on = render_route(_with_exposure(), {"1.0.0": 80, "1.1.0": 20})["spec"]
    assert on["tls"]["termination"] == "reencrypt" and on["port"] == {"targetPort": "https"}
    assert "destinationCACertificate" not in on["tls"]  # the router trusts the service CA for reencrypt
    off = render_route(_with_exposure(auth=False), {"1.0.0": 100})["spec"]
    assert off["tls"]["termination"] == "edge" and off["port"] == {"targetPort": 8080}
    # An explicit edge with auth on goes straight to the runtime, which checks the token itself.
    edge = render_route(_with_exposure(tls="edge"), {"1.0.0": 100})["spec"]
    assert edge["tls"]["termination"] == "edge" and edge["port"] == {"targetPort": 8080}


def test_runtime_env_names_its_inferenceservice_and_proxy_trust_follows_the_mesh():
    env = _env(make_dm())
    assert env["ARBITER_AUTH"] == "true"
    assert env["ARBITER_AUTH_NAMESPACE"] == "team-a"
    assert env["ARBITER_AUTH_INFERENCESERVICE"] == "credit-limit--1-0-0"
    assert env["ARBITER_AUTH_PROXY_HEADERS"] == "true"
    raw = example()
    raw["spec"]["mesh"] = {"sidecar": "none"}
    assert _env(make_dm(raw), {"istio-injection": "enabled"})["ARBITER_AUTH_PROXY_HEADERS"] == "false"
    assert _env(make_dm(raw), {})["ARBITER_AUTH_PROXY_HEADERS"] == "true"
    assert _env(_with_exposure(auth=False))["ARBITER_AUTH_PROXY_HEADERS"] == "false"
