"""Who the predictor pods are to S3: spec.serving.serviceAccountName and spec.serving.awsWebIdentity rendered into the
InferenceService (the pods' ServiceAccount; a projected token and botocore's web identity environment in the runtime
container), and refused at the API when malformed."""

from __future__ import annotations

import pytest
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.render import PredictorInputs, render_configmap, render_inferenceservice
from pydantic import ValidationError
from support.examples import example
from support.factory import make_dm

ROLE = "arn:aws:iam::123456789012:role/credit-audit-writer"


def _predictor(**serving):
    raw = example()
    raw["spec"]["serving"].update(serving)
    dm = make_dm(raw)
    v = dm.spec.versions[0]
    isvc = render_inferenceservice(PredictorInputs(dm, v, render_configmap(dm, v), {}))
    return isvc["spec"]["predictor"]


def _env(model):
    return {e["name"]: e["value"] for e in model["env"]}


def test_nothing_is_rendered_unless_asked():
    pred = _predictor()
    assert "serviceAccountName" not in pred
    assert not any(n.startswith("AWS_") for n in _env(pred["model"]))
    assert not any(v["name"] == "aws-web-identity" for v in pred["volumes"])


def test_the_service_account_alone_is_what_a_pod_identity_webhook_needs():
    pred = _predictor(serviceAccountName="credit-scorer")
    assert pred["serviceAccountName"] == "credit-scorer"
    assert not any(n.startswith("AWS_") for n in _env(pred["model"]))  # the webhook injects those


def test_a_web_identity_is_a_projected_token_and_botocores_environment_in_the_runtime():
    pred = _predictor(serviceAccountName="credit-scorer", awsWebIdentity={
        "roleArn": ROLE, "audience": "minio", "stsEndpoint": "https://s3.internal:9000", "region": "eu-west-1",
        "tokenExpirationSeconds": 7200})
    [volume] = [v for v in pred["volumes"] if v["name"] == "aws-web-identity"]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "minio", "expirationSeconds": 7200, "path": "token"}}]
    model = pred["model"]
    [mount] = [m for m in model["volumeMounts"] if m["name"] == "aws-web-identity"]
    assert mount["readOnly"] is True
    env = _env(model)
    assert env["AWS_ROLE_ARN"] == ROLE
    assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == mount["mountPath"] + "/token"
    assert env["AWS_ENDPOINT_URL_STS"] == "https://s3.internal:9000"
    assert env["AWS_REGION"] == "eu-west-1" and env["AWS_STS_REGIONAL_ENDPOINTS"] == "regional"
    assert env["AWS_ROLE_SESSION_NAME"].startswith("arbiter-") and len(env["AWS_ROLE_SESSION_NAME"]) <= 64
    assert env["ARBITER_DECISION_CONFIG"]  # the runtime's own settings stay
    # The worker pods of a multi-node predictor read no S3: nothing of it there.
    assert "workerSpec" not in pred


def test_defaults_are_aws_sts_with_an_hour_long_token():
    pred = _predictor(awsWebIdentity={"roleArn": ROLE})
    [volume] = [v for v in pred["volumes"] if v["name"] == "aws-web-identity"]
    assert volume["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "sts.amazonaws.com"
    assert volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] == 3600
    assert "AWS_ENDPOINT_URL_STS" not in _env(pred["model"]) and "AWS_REGION" not in _env(pred["model"])


@pytest.mark.parametrize("arn", [ROLE, "arn:aws-cn:iam::123456789012:role/path/to/r",
                                 "arn:minio:iam:us-east-1::role/x-Y_z"])
def test_role_arns_of_aws_and_s3_compatible_stss_are_accepted(arn):
    assert _predictor(awsWebIdentity={"roleArn": arn})["model"]


@pytest.mark.parametrize("bad", [
    {"awsWebIdentity": {"roleArn": "credit-audit-writer"}},
    {"awsWebIdentity": {"roleArn": "arn:aws:s3:::bucket"}},
    {"awsWebIdentity": {"roleArn": ROLE, "stsEndpoint": "sts.example"}},
    {"awsWebIdentity": {"roleArn": ROLE, "tokenExpirationSeconds": 60}},
    {"awsWebIdentity": {"roleArn": ROLE, "audince": "typo"}},
    {"serviceAccountName": "Credit_Scorer"},
])
def test_malformed_identities_are_refused(bad):
    raw = example()
    raw["spec"]["serving"].update(bad)
    with pytest.raises(ValidationError):
        DecisionModel.model_validate(raw)
