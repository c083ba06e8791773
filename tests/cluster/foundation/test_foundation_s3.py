"""The S3 server speaks S3 to boto3: buckets, objects, listing, and it checks credentials."""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError


def test_put_get_and_list_objects(s3_server):
    s3 = s3_server.client()
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="credit-risk/v3/config.json", Body=b'{"num_attention_heads": 32}')
    s3.put_object(Bucket=bucket, Key="credit-risk/v3/model.safetensors", Body=b"\0" * 1024)

    got = s3.get_object(Bucket=bucket, Key="credit-risk/v3/config.json")
    assert got["Body"].read() == b'{"num_attention_heads": 32}'
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="credit-risk/v3/")
    assert sorted((o["Key"], o["Size"]) for o in listed["Contents"]) == [
        ("credit-risk/v3/config.json", 27),
        ("credit-risk/v3/model.safetensors", 1024),
    ]


def test_wrong_secret_is_refused(s3_server):
    wrong = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key="not-the-secret",
        region_name=s3_server.region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as err:
        wrong.list_buckets()
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_repr_does_not_reveal_the_secret(s3_server):
    assert s3_server.secret_key not in repr(s3_server)
