"""The operator's observer hooks on the real apiserver, the real registry and real S3.

`observe_registry` finds the registry through a ModelRegistry resource (its status.hosts) and a token Secret;
`observe_artifacts` reads the storage-config Secret. Both are what the operator runs on every reconcile.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from urllib.parse import urlparse

import pytest
from arbiter_devenv.registryserver import free_port
from arbiter_operator.api.models import VersionStatus
from arbiter_operator.observe.storage import observe_artifacts
from arbiter_operator.plan.model import Observations
from arbiter_operator.reconcile import utc_now
from arbiter_operator.sync.registry import sync_registry_step as observe_registry
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from support.factory import make_dm

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio(loop_scope="session")]

QWEN_LIKE = {"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_hidden_layers": 36, "max_position_embeddings": 40960}


class Kube:
    """The reads the hooks make (kube.client.KubeClient.aget), straight on the apiserver through the kubernetes
    client, plus the writes the tests need to set the scene."""

    def __init__(self, api: k8s.ApiClient):
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    def get(self, api_version, kind, namespace, name):
        try:
            if kind == "Secret":
                obj = self.core.read_namespaced_secret(name, namespace)
            elif kind == "ConfigMap":
                obj = self.core.read_namespaced_config_map(name, namespace)
            elif kind == "ModelRegistry":
                group, version = api_version.split("/")
                return self.custom.get_namespaced_custom_object(group, version, namespace, "modelregistries", name)
            else:
                raise AssertionError(f"the hooks read no {kind}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self.api.sanitize_for_serialization(obj)

    async def aget(self, api_version, kind, namespace, name):
        """The awaited read the hooks make (KubeClient.aget), the blocking client in a thread."""
        return await asyncio.to_thread(self.get, api_version, kind, namespace, name)

    def create(self, obj):
        ns = obj["metadata"]["namespace"]
        if obj["kind"] == "Secret":
            return self.core.create_namespaced_secret(ns, obj)
        group, version = obj["apiVersion"].split("/")
        return self.custom.create_namespaced_custom_object(group, version, ns, "modelregistries", obj)

    def patch_status(self, api_version, kind, namespace, name, patch):
        group, version = api_version.split("/")
        return self.custom.patch_namespaced_custom_object_status(group, version, namespace, "modelregistries", name,
                                                                 patch)


@pytest.fixture
def kube(control_plane):
    api = control_plane.api_client()
    yield Kube(api)
    api.close()


def create(kube, obj):
    return kube.create(obj)


def model_registry_resource(kube, namespace, url):
    """A ModelRegistry as the registry operator leaves it: spec.rest.port and the hosts in status."""
    parsed = urlparse(url)
    name = "modelregistry-public"
    create(kube, {"apiVersion": "modelregistry.opendatahub.io/v1beta1", "kind": "ModelRegistry",
                  "metadata": {"name": name, "namespace": namespace},
                  "spec": {"rest": {"port": parsed.port}, "grpc": {}}})
    kube.patch_status("modelregistry.opendatahub.io/v1beta1", "ModelRegistry", namespace, name,
                      {"status": {"hosts": [parsed.hostname], "hostsStr": parsed.hostname}})
    return name


def token_secret(kube, namespace, token):
    create(kube, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry-token", "namespace": namespace},
                  "type": "Opaque", "data": {"token": base64.b64encode(token.encode()).decode()}})


def conditions(obs, type_):
    return [c for c in obs.extra_conditions if c.type == type_]


async def test_registry_found_through_a_model_registry_resource(kube, namespace, model_registry):
    name = model_registry_resource(kube, namespace, model_registry.url)
    token_secret(kube, namespace, "t0ken")
    dm = make_dm(model=f"m-{uuid.uuid4().hex[:6]}", versions=["1.0.0"], namespace=namespace,
                 registry={"modelRegistryRef": {"name": name}, "tokenSecretRef": {"name": "registry-token"}})

    obs = await observe_registry(kube, dm, Observations(), now=utc_now())

    [cond] = conditions(obs, "Registered")
    assert cond.status == "True", cond.message
    assert set(obs.registry_ids["1.0.0"]) == {"registeredModelId", "modelVersionId", "modelArtifactId"}


async def test_registry_down_keeps_the_ids_already_in_status(kube, namespace):
    dead = f"http://127.0.0.1:{free_port()}"
    dm = make_dm(model="m", versions=["1.0.0", "2.0.0"], namespace=namespace, registry={"url": dead})
    dm.status.versions = [VersionStatus(name="1.0.0", registeredModelId="7", modelVersionId="8", modelArtifactId="9"),
                          VersionStatus(name="0.9.0", registeredModelId="7", modelVersionId="5")]  # left the spec

    obs = await observe_registry(kube, dm, Observations(), now=utc_now())

    [cond] = conditions(obs, "Registered")
    assert (cond.status, cond.reason) == ("Unknown", "RegistryUnreachable")
    assert obs.registry_ids == {"1.0.0": {"registeredModelId": "7", "modelVersionId": "8", "modelArtifactId": "9"}}


async def test_missing_token_secret_is_reported(kube, namespace, model_registry):
    dm = make_dm(model="m", versions=["1.0.0"], namespace=namespace,
                 registry={"url": model_registry.url, "tokenSecretRef": {"name": "nope"}})
    obs = await observe_registry(kube, dm, Observations(), now=utc_now())
    [cond] = conditions(obs, "Registered")
    assert (cond.status, cond.reason) == ("False", "RegistryRejected")
    assert "Secret nope" in cond.message


async def test_no_registry_configured_means_no_condition(kube, namespace):
    obs = await observe_registry(kube, make_dm(model="m", versions=["1.0.0"], namespace=namespace), Observations(),
        now=utc_now())
    assert obs.extra_conditions == () and obs.registry_ids == {}


def storage_config_secret(kube, namespace, s3_server, bucket, name="storage-config", endpoint=None):
    entry = {"type": "s3", "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
             "endpoint_url": endpoint or s3_server.endpoint_url, "region": s3_server.region, "verify_ssl": "0"}
    create(kube, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
                  "type": "Opaque",
                  "data": {bucket: base64.b64encode(json.dumps(entry).encode()).decode()}})


@pytest.fixture
def model_dirs(s3_server):
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    for prefix, heads in (("good", 32), ("bad", 6)):
        client.put_object(Bucket=bucket, Key=f"{prefix}/config.json",
                          Body=json.dumps(dict(QWEN_LIKE, num_attention_heads=heads, num_key_value_heads=heads)))
        client.put_object(Bucket=bucket, Key=f"{prefix}/model.safetensors", Body=b"weights")
    return bucket


async def test_artifacts_checked_with_the_storage_config_secret(kube, namespace, s3_server, model_dirs):
    storage_config_secret(kube, namespace, s3_server, model_dirs)
    dm = make_dm(model="m", versions={"1.0.0": f"s3://{model_dirs}/good", "2.0.0": f"s3://{model_dirs}/bad"},
                 namespace=namespace, gpus=4)

    obs = await observe_artifacts(kube, dm, Observations(), now=utc_now())

    assert obs.artifacts["1.0.0"].valid is True and obs.artifacts["1.0.0"].digest.startswith("sha256:")
    assert obs.artifacts["2.0.0"].valid is False
    [cond] = conditions(obs, "ArtifactsValid")
    assert (cond.status, cond.reason) == ("False", "TensorParallelMismatch")
    assert cond.message.startswith("version 2.0.0: tensor parallel 4 does not divide 6 attention heads; use 1 or 2")


async def test_missing_storage_secret_says_which(kube, namespace, model_dirs):
    dm = make_dm(model="m", versions={"1.0.0": f"s3://{model_dirs}/good"}, namespace=namespace)
    obs = await observe_artifacts(kube, dm, Observations(), now=utc_now())
    [cond] = conditions(obs, "ArtifactsValid")
    assert (cond.status, cond.reason) == ("Unknown", "StorageCredentialsInvalid")
    assert "Secret storage-config not found" in cond.message


async def test_s3_outage_keeps_a_serving_version_valid(kube, namespace, s3_server, model_dirs):
    storage_config_secret(kube, namespace, s3_server, model_dirs, endpoint=f"http://127.0.0.1:{free_port()}")
    dm = make_dm(model="m", versions={"1.0.0": f"s3://{model_dirs}/good", "2.0.0": f"s3://{model_dirs}/bad"},
                 namespace=namespace)
    dm.status.versions = [VersionStatus(name="1.0.0", phase="Ready", artifactsDigest="sha256:before")]

    obs = await observe_artifacts(kube, dm, Observations(), now=utc_now())

    [cond] = conditions(obs, "ArtifactsValid")
    assert (cond.status, cond.reason) == ("Unknown", "StorageUnreachable")
    assert obs.artifacts["1.0.0"].valid is True and obs.artifacts["1.0.0"].digest == "sha256:before"
    assert obs.artifacts["2.0.0"].valid is None  # never checked: not deployed until known


class CountingKube(Kube):
    def __init__(self, api):
        super().__init__(api)
        self.secret_reads = 0

    def get(self, api_version, kind, namespace, name):
        self.secret_reads += kind == "Secret"
        return super().get(api_version, kind, namespace, name)


async def test_a_fleets_checks_share_the_storage_secret_for_seconds_only(kube, namespace, s3_server, model_dirs):
    """Ten DecisionModels checked at once read their namespace's storage Secret once; a check that starts once the
    read is 10 s old reads it again and sees a rotation (here: the Secret now points at an endpoint that is down)."""
    from arbiter_operator.observe.storage import VerdictCache

    counting = CountingKube(kube.api)
    now = [0.0]
    verdicts = VerdictCache(clock=lambda: now[0])
    storage_config_secret(kube, namespace, s3_server, model_dirs)
    for i in range(10):
        dm = make_dm(model=f"m{i}", versions={"1.0.0": f"s3://{model_dirs}/good"}, namespace=namespace,
                     uid=str(uuid.uuid4()))  # each its own object: no verdict is shared, only the Secret read
        obs = await observe_artifacts(counting, dm, Observations(), utc_now(), verdicts)
        assert obs.artifacts["1.0.0"].valid is True
    assert counting.secret_reads == 1

    kube.core.delete_namespaced_secret("storage-config", namespace)
    storage_config_secret(kube, namespace, s3_server, model_dirs, endpoint=f"http://127.0.0.1:{free_port()}")
    now[0] = 10.0
    dm = make_dm(model="late", versions={"1.0.0": f"s3://{model_dirs}/good"}, namespace=namespace,
                 uid=str(uuid.uuid4()))
    obs = await observe_artifacts(counting, dm, Observations(), utc_now(), verdicts)
    assert counting.secret_reads == 2
    [cond] = conditions(obs, "ArtifactsValid")
    assert (cond.status, cond.reason) == ("Unknown", "StorageUnreachable")  # the rotated Secret's endpoint

    kube.core.delete_namespaced_secret("storage-config", namespace)
    now[0] = 20.0
    obs = await observe_artifacts(counting, make_dm(model="gone", versions={"1.0.0": f"s3://{model_dirs}/good"},
                                                    namespace=namespace, uid=str(uuid.uuid4())),
                                  Observations(), utc_now(), verdicts)
    [cond] = conditions(obs, "ArtifactsValid")
    assert "Secret storage-config not found" in cond.message


async def test_a_fleet_serving_one_model_reads_its_artifacts_once(kube, namespace, s3_server, model_dirs):
    """Ten DecisionModels of one model (one storageUri, one Secret) checked at once: S3 is read for one of them, and
    every one gets the verdict; another model's DecisionModel is checked on its own."""
    from arbiter_operator.observe.storage import StoragePool, VerdictCache

    class CountingPool(StoragePool):
        checks = 0

        def use(self, creds):
            CountingPool.checks += 1
            return super().use(creds)

    verdicts = VerdictCache()
    verdicts.storages = CountingPool(idle=30.0)
    storage_config_secret(kube, namespace, s3_server, model_dirs)
    dms = [make_dm(model=f"m{i}", versions={"1.0.0": f"s3://{model_dirs}/good"}, namespace=namespace,
                   uid=str(uuid.uuid4())) for i in range(10)]
    dms.append(make_dm(model="other", versions={"1.0.0": f"s3://{model_dirs}/bad"}, namespace=namespace, gpus=4,
                       uid=str(uuid.uuid4())))
    observed = await asyncio.gather(*[observe_artifacts(kube, dm, Observations(), utc_now(), verdicts) for dm in dms])
    assert [obs.artifacts["1.0.0"].valid for obs in observed] == [True] * 10 + [False]
    assert CountingPool.checks == 2
    await verdicts.storages.aclose()
