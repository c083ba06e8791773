"""Who the predictor pods are to S3: the ServiceAccount they run as (spec.serving.serviceAccountName) and, where no
pod identity webhook injects one, the web identity the runtime's boto3 reads (spec.serving.awsWebIdentity): a
projected ServiceAccount token with the identity provider's audience, and the environment of botocore's
AssumeRoleWithWebIdentity provider. The kubelet renews the token before it expires and botocore re-reads the file at
each exchange, so nothing long-lived is stored anywhere."""

from __future__ import annotations

from typing import Any

from ..api.models import DecisionModel

TOKEN_VOLUME = "aws-web-identity"
TOKEN_DIR = "/var/run/secrets/arbiter.dev/aws"  # not the EKS webhook's path: the two never collide
TOKEN_FILE = "token"
SESSION_NAME_MAX = 64  # STS's RoleSessionName limit


def pod_account(dm: DecisionModel) -> dict[str, Any]:
    """The predictor's serviceAccountName, when the DecisionModel names one."""
    name = dm.spec.serving.serviceAccountName
    return {"serviceAccountName": name} if name else {}


def identity_volumes(dm: DecisionModel) -> list[dict[str, Any]]:
    web = dm.spec.serving.awsWebIdentity
    if web is None:
        return []
    token = {"audience": web.audience, "expirationSeconds": web.tokenExpirationSeconds, "path": TOKEN_FILE}
    return [{"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}]


def identity_mounts(dm: DecisionModel) -> list[dict[str, Any]]:
    if dm.spec.serving.awsWebIdentity is None:
        return []
    return [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}]


def identity_env(dm: DecisionModel) -> list[dict[str, str]]:
    """botocore's web identity settings; the session name says which model asked (STS's and S3's audit logs)."""
    web = dm.spec.serving.awsWebIdentity
    if web is None:
        return []
    session = f"arbiter-{dm.metadata.namespace}-{dm.metadata.name}"[:SESSION_NAME_MAX]
    env = [
        {"name": "AWS_ROLE_ARN", "value": web.roleArn},
        {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{TOKEN_DIR}/{TOKEN_FILE}"},
        {"name": "AWS_ROLE_SESSION_NAME", "value": session},
    ]
    if web.stsEndpoint:
        env.append({"name": "AWS_ENDPOINT_URL_STS", "value": web.stsEndpoint})
    if web.region:
        env += [{"name": "AWS_REGION", "value": web.region},
                {"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]
    return env
