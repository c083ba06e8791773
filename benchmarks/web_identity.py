"""The benchmarks' S3 with the operator's own web identity (`--web-identity`): the S3 server's STS trusts the local
cluster's ServiceAccount issuer, the operator runs with a token of its ServiceAccount for that STS, as the chart's
`aws.webIdentity` renders it, and the namespaces' storage-config entries hold no keys (docs/security.md, "S3
credentials")."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from arbiter_devenv.s3server import S3Server, cluster_issuer
from kubernetes import client as k8s

AUDIENCE = "sts.amazonaws.com"


def start_s3(cluster: Any, namespace: str, account: str, workdir: pathlib.Path) -> tuple[S3Server, dict[str, str]]:
    """The S3 server trusting `account`'s tokens, and the operator's environment: the token file, the role, STS."""
    s3 = S3Server(web_identity=cluster_issuer(cluster, AUDIENCE, (f"system:serviceaccount:{namespace}:{account}",)))
    s3.start()
    api = cluster.api_client()
    try:
        answer = k8s.CoreV1Api(api).create_namespaced_service_account_token(
            account, namespace, {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 86400}})
    finally:
        api.close()
    token = workdir / "aws-web-identity-token"
    token.write_text(answer.status.token)
    env = {"ARBITER_S3_OWN_CREDENTIALS": "true", "AWS_ROLE_ARN": s3.role_arn,
           "AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_ENDPOINT_URL_STS": s3.endpoint_url,
           "AWS_REGION": s3.region, "AWS_ROLE_SESSION_NAME": "arbiter-operator",
           # nothing else botocore's chain could find instead
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true"}
    return s3, env


def keyless_storage_config(s3: S3Server) -> dict[str, Any]:
    """KServe's storage-config Secret saying where, not with what."""
    entry = {"type": "s3", "endpoint_url": s3.endpoint_url, "region": s3.region, "verify_ssl": "0"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "storage-config"}, "type": "Opaque",
            "stringData": {"default": json.dumps(entry)}}
