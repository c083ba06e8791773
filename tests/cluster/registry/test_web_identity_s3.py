"""S3 with web-identity credentials only, against a real S3 server's STS that trusts the cluster's own ServiceAccount
issuer, as IRSA and ROSA set it up: the local kube-apiserver publishes its issuer's discovery document and keys on
loopback (HTTPS, read anonymously through the system:service-account-issuer-discovery role, as the identity
providers of AWS read a cluster's), the S3 server's STS (AssumeRoleWithWebIdentity) verifies the apiserver's tokens
with them, and a TokenRequest gives a ServiceAccount's token with the STS's audience, as the kubelet projects it.

- the operator's artifact check reads a storage-config entry without keys with its own credentials (botocore's chain:
  AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ENDPOINT_URL_STS), from the Secret on the real apiserver;
- the runtime's S3 audit (boto3) writes under object-lock retention with the environment the operator renders from
  spec.serving.awsWebIdentity;
- an expired token (signed by the cluster's key, its `exp` passed), a token of another audience and one of a
  ServiceAccount the role's trust policy does not name are a clear Unknown verdict (resp. records kept, the failure
  named as the credentials'), never a crash nor a settled verdict, and a current token afterwards works.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import pytest
from arbiter_devenv.s3server import DISCOVERY_BINDING, S3Server, cluster_issuer
from arbiter_operator.clients.s3_identity import OwnCredentials
from arbiter_operator.observe.storage import VerdictCache, observe_artifacts
from arbiter_operator.plan.model import Observations
from arbiter_operator.reconcile import utc_now
from arbiter_operator.render.identity import identity_env
from arbiter_runtime.audit_s3 import S3BatchSink, S3Settings
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from support.examples import example
from support.factory import make_dm

pytestmark = pytest.mark.cluster
on_the_session_loop = pytest.mark.asyncio(loop_scope="session")

AUDIENCE = "arbiter-s3"
QWEN_LIKE = {"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_hidden_layers": 36, "max_position_embeddings": 40960}


@pytest.fixture(scope="module")
def issuer(control_plane, account):
    """The cluster's ServiceAccount issuer, readable anonymously on loopback (what an identity provider fetches), and
    the one ServiceAccount the S3 server's role trusts."""
    _, ns, name = account
    found = cluster_issuer(control_plane, AUDIENCE, (f"system:serviceaccount:{ns}:{name}",))
    assert found.jwks_url == f"{control_plane.server}/openid/v1/jwks"
    yield found
    api = control_plane.api_client()
    k8s.RbacAuthorizationV1Api(api).delete_cluster_role_binding(DISCOVERY_BINDING)
    api.close()


@pytest.fixture(scope="module")
def sts_s3(issuer):
    server = S3Server(web_identity=issuer).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def account(control_plane):
    """A namespace and the ServiceAccount whose tokens are the web identity; (core API, namespace, name)."""
    if getattr(control_plane, "workdir", None) is None:
        pytest.skip("needs the local control plane: its issuer's keys on loopback and its signing key")
    api = control_plane.api_client()
    core = k8s.CoreV1Api(api)
    ns = f"webid-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "models-reader"}})
    yield core, ns, "models-reader"
    core.delete_namespace(ns)
    api.close()


def token(account, audience: str = AUDIENCE) -> str:
    core, ns, name = account
    answer = core.create_namespaced_service_account_token(
        name, ns, {"spec": {"audiences": [audience], "expirationSeconds": 3600}})
    return answer.status.token


def stranger(account):
    """Another ServiceAccount of the namespace: its tokens are the cluster's, but the role's trust policy names only
    the account's."""
    core, ns, _ = account
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": "stranger"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return core, ns, "stranger"


def expired(control_plane, account) -> str:
    """A token as the apiserver signs them, with its `exp` an hour past: what a projected token is once the kubelet
    stopped renewing it."""
    header, payload, _ = token(account).split(".")

    def decoded(part: str) -> dict:
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))

    def encoded(doc: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")

    claims = decoded(payload)
    now = int(time.time())
    claims.update(iat=now - 7200, nbf=now - 7200, exp=now - 3600)
    signing_input = f"{header}.{encoded(claims)}"
    key = serialization.load_pem_private_key((control_plane.workdir / "pki" / "sa.key").read_bytes(), None)
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    signature = base64.urlsafe_b64encode(r.to_bytes(32, "big") + s.to_bytes(32, "big")).decode().rstrip("=")
    return f"{signing_input}.{signature}"


@pytest.fixture
def web_identity(sts_s3, tmp_path, monkeypatch):
    """This process's AWS environment: the web identity and nothing else botocore could use. Yields the token file."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # The environment the operator renders into a runtime from spec.serving.awsWebIdentity (the chart's for the
    # operator names the same variables), with the token where this test keeps it instead of the projected volume.
    raw = example()
    raw["spec"]["serving"]["awsWebIdentity"] = {"roleArn": sts_s3.role_arn, "audience": AUDIENCE,
                                                "stsEndpoint": sts_s3.endpoint_url, "region": sts_s3.region}
    dm = make_dm(raw, namespace="credit-models")
    file = tmp_path / "token"
    for var in identity_env(dm):
        monkeypatch.setenv(var["name"], str(file) if var["name"] == "AWS_WEB_IDENTITY_TOKEN_FILE" else var["value"])
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # each sink resolves the chain afresh, as a new pod does
    return file


@pytest.fixture(scope="module")
def model_bucket(sts_s3):
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    root = sts_s3.client()
    root.create_bucket(Bucket=bucket)
    root.put_object(Bucket=bucket, Key="qwen/config.json", Body=json.dumps(QWEN_LIKE).encode())
    root.put_object(Bucket=bucket, Key="qwen/model.safetensors", Body=b"weights")
    return bucket


class SecretReads:
    """The one read the artifact check makes of the cluster (KubeClient.aget), on the real apiserver."""

    def __init__(self, core: k8s.CoreV1Api):
        self.core = core

    async def aget(self, api_version, kind, namespace, name):
        assert kind == "Secret", kind
        try:
            secret = await asyncio.to_thread(self.core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {"data": secret.data}


def keyless_storage_config(account, sts_s3, bucket) -> None:
    """A storage-config Secret whose entry says where, not with what: no access_key_id, no secret_access_key."""
    core, ns, _ = account
    entry = {"type": "s3", "endpoint_url": sts_s3.endpoint_url, "region": sts_s3.region, "bucket": bucket}
    try:
        core.delete_namespaced_secret("storage-config", ns)
    except ApiException:
        pass
    core.create_namespaced_secret(ns, {"metadata": {"name": "storage-config"},
                                       "data": {bucket: base64.b64encode(json.dumps(entry).encode()).decode()}})


async def check(account, own: OwnCredentials, bucket: str):
    core, ns, _ = account
    dm = make_dm(model="qwen", versions={"1.0.0": f"s3://{bucket}/qwen"}, namespace=ns, gpus=4)
    obs = await observe_artifacts(SecretReads(core), dm, Observations(), utc_now(), VerdictCache(
        ttl=0.0, own_credentials=own))
    [cond] = [c for c in obs.extra_conditions if c.type == "ArtifactsValid"]
    return obs, cond


@on_the_session_loop
async def test_the_artifact_check_reads_with_the_operators_web_identity_only(web_identity, account, sts_s3,
                                                                             model_bucket):
    keyless_storage_config(account, sts_s3, model_bucket)
    web_identity.write_text(token(account))
    obs, cond = await check(account, OwnCredentials(), model_bucket)
    assert (cond.status, cond.reason) == ("True", "ArtifactsValid"), cond.message
    assert obs.artifacts["1.0.0"].valid is True and obs.artifacts["1.0.0"].digest.startswith("sha256:")


@on_the_session_loop
@pytest.mark.parametrize("bad", ["expired", "another audience", "another account"])
async def test_a_token_sts_refuses_is_unknown_naming_it_and_passes_once_current(web_identity, control_plane, account,
                                                                                 sts_s3, model_bucket, bad):
    keyless_storage_config(account, sts_s3, model_bucket)
    bad_token = {"expired": lambda: expired(control_plane, account),
                 "another audience": lambda: token(account, "someone-else"),
                 "another account": lambda: token(stranger(account))}[bad]()
    web_identity.write_text(bad_token)
    own = OwnCredentials()
    obs, cond = await check(account, own, model_bucket)
    assert (cond.status, cond.reason) == ("Unknown", "StorageCredentialsInvalid")
    assert "the operator's AWS credentials (assume-role-with-web-identity): STS's AssumeRoleWithWebIdentity refused" \
        in cond.message and "AWS_WEB_IDENTITY_TOKEN_FILE" in cond.message
    assert web_identity.read_text()[:40] not in cond.message
    assert obs.artifacts["1.0.0"].valid is None  # not judged: no verdict either way
    # The kubelet renews the token: the same operator (the same credentials object) passes at the next check.
    web_identity.write_text(token(account))
    _, cond = await check(account, own, model_bucket)
    assert (cond.status, cond.reason) == ("True", "ArtifactsValid"), cond.message


def test_the_runtime_audit_writes_under_retention_with_the_rendered_web_identity(web_identity, account, sts_s3):
    bucket = f"audit-{uuid.uuid4().hex[:8]}"
    root = sts_s3.client()
    root.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    web_identity.write_text(token(account))
    sink = S3BatchSink(S3Settings(bucket=bucket, endpoint_url=sts_s3.endpoint_url, region=sts_s3.region,
                                  retention_days=1, lock_mode="GOVERNANCE"), "credit", "v1")
    sink._check_retention()
    assert sink.retention == "locked", sink._last_error
    sink.write('{"n":1}')
    assert sink.flush() == 1
    [key] = [o["Key"] for o in root.list_objects_v2(Bucket=bucket)["Contents"]]
    assert key.startswith("audit/credit/v1/")
    assert root.get_object_retention(Bucket=bucket, Key=key)["Retention"]["Mode"] == "GOVERNANCE"


def test_the_runtime_audit_keeps_its_records_while_the_token_is_expired(web_identity, control_plane, account,
                                                                        sts_s3):
    bucket = f"audit-{uuid.uuid4().hex[:8]}"
    root = sts_s3.client()
    root.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    web_identity.write_text(expired(control_plane, account))
    sink = S3BatchSink(S3Settings(bucket=bucket, endpoint_url=sts_s3.endpoint_url, region=sts_s3.region,
                                  retention_days=1, lock_mode="GOVERNANCE"), "credit", "v1")
    sink._check_retention()
    sink.write('{"n":1}')
    sink.write('{"n":2}')
    assert sink.retention is None and sink.flush() == 0 and sink.waiting == 2  # kept, written nowhere
    assert sink._last_error.startswith("credentials: STS AssumeRoleWithWebIdentity answered ")
    assert "Contents" not in root.list_objects_v2(Bucket=bucket)
    web_identity.write_text(token(account))  # renewed
    assert sink.flush() == 2 and sink.retention == "locked"
    [key] = [o["Key"] for o in root.list_objects_v2(Bucket=bucket)["Contents"]]
    body = root.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()
    assert [json.loads(x) for x in body] == [{"n": 1}, {"n": 2}]
