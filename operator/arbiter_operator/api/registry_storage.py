"""Where a DecisionModel's versions are recorded and read from: the Model Registry (spec.registry) and the object
storage holding the weights (spec.storage)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .fields import Name, _cel, _checked, _Model

# KServe's own name for the Secret its storage initializer reads (one key per storage profile).
DEFAULT_STORAGE_SECRET = "storage-config"


class ObjectRef(_Model):
    name: Name
    namespace: Name | None = Field(None, description="Defaults to the DecisionModel's namespace.")


class LocalRef(_Model):
    name: Name
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = None


class RegistrySpec(_Model):
    model_config = _checked(
        _cel(
            "has(self.modelRegistryRef) != has(self.url)",
            "spec.registry needs exactly one of modelRegistryRef or url",
        )
    )
    modelRegistryRef: ObjectRef | None = Field(
        None, description="A ModelRegistry (modelregistry.opendatahub.io); its status gives the REST address."
    )
    url: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="Registry REST base URL, when not found through a ModelRegistry."
    )
    tokenSecretRef: LocalRef | None = Field(
        None, description="Secret with the bearer token (key `token` by default); default: the operator's own token."
    )
    caBundleConfigMapRef: LocalRef | None = Field(
        None, description="ConfigMap with the CA bundle (key `ca.crt` by default) for the registry's TLS."
    )


class StorageSpec(_Model):
    secretName: Name = Field(
        DEFAULT_STORAGE_SECRET, description="Secret in KServe's storage-config form (one JSON entry per key)."
    )
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        None, description="Entry in the Secret; default: the entry named after the bucket, then `default`."
    )
    endpoint: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        None, pattern=r"^https?://", description="S3 endpoint override (e.g. MinIO)."
    )
    region: Annotated[str, StringConstraints(max_length=64)] | None = None
    caBundleConfigMapRef: LocalRef | None = Field(None, description="ConfigMap with the CA bundle for the endpoint.")
