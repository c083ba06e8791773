"""The S3 audit copy on the real S3 server behind a hostile proxy: stored-but-500, resets, throttling. Every record
lands exactly once: one object per batch however often it is retried, no line twice, none missing."""

from __future__ import annotations

import collections
import io
import json
import uuid

import boto3
from arbiter_runtime.audit import S3BatchSink, S3Settings, StdoutSink
from arbiter_runtime.service import RuntimeOptions
from botocore.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile_s3 import S3FaultProxy, S3Request
from support.polling import eventually
from support.runtime_helpers import base_config


def client_via(s3_server, s3_proxy: S3FaultProxy, attempts: int = 3):
    return boto3.client("s3", endpoint_url=s3_proxy.endpoint_url, aws_access_key_id=s3_server.access_key,
                        aws_secret_access_key=s3_server.secret_key, region_name=s3_server.region,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"mode": "standard", "max_attempts": attempts}))


def new_bucket(s3, lock: bool = False) -> str:
    name = f"audit-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True) if lock else s3.create_bucket(Bucket=name)
    return name


def lines_per_key(s3, bucket: str) -> dict[str, list[str]]:
    """What a reader of the audit bucket sees: each key's (latest) lines."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode().splitlines()
    return out


def is_object_put(request: S3Request) -> bool:
    return request.method == "PUT" and request.path.count("/") >= 3 and not request.query


def test_a_lost_acknowledgement_never_duplicates_records(s3_server, s3_proxy, standin, make_runtime):
    """S3 stores every upload but answers 500, up to three times per object (boto3's own retries and the sink's):
    the decision server's 300 records are 300 lines in S3, one object per batch."""
    s3 = s3_server.client()
    bucket = new_bucket(s3)
    puts: collections.Counter[str] = collections.Counter()

    def fault(request: S3Request) -> str:
        if is_object_put(request):
            puts[request.path] += 1
            return "ack_lost" if puts[request.path] <= 3 else "pass"
        return "pass"

    s3_proxy.fault = fault
    stdout = io.StringIO()
    sink = S3BatchSink(S3Settings(bucket=bucket, batch_records=20, interval_s=0.1), "credit", "v1",
                       client=client_via(s3_server, s3_proxy))
    server = make_runtime(base_config(standin.url), RuntimeOptions(audit_sinks=[StdoutSink(stdout), sink]))
    with server.client() as c:
        for n in range(300):
            c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
    server.stop()
    assert server.runtime.audit_lost == {"stdout": 0, "s3": 0}
    stored = lines_per_key(s3, bucket)
    assert s3_proxy.faults("ack_lost") >= len(stored)  # each object stored with its answer lost, at least once
    assert any(request.method == "HEAD" for request, _ in s3_proxy.seen)  # the sink asked before a PUT again
    on_stdout = stdout.getvalue().splitlines()
    in_s3 = [line for lines in stored.values() for line in lines]
    assert len(on_stdout) == 300 and sorted(in_s3) == sorted(on_stdout)  # each record once: 300 lines, not 350
    assert sorted(stored) == sorted(sink.uploaded_objects)


def test_throttled_for_five_seconds_every_record_lands_once(s3_server, s3_proxy, standin, make_runtime):
    s3 = s3_server.client()
    bucket = new_bucket(s3, lock=True)
    stdout = io.StringIO()
    sink = S3BatchSink(S3Settings(bucket=bucket, batch_records=10, interval_s=0.2, retention_days=1,
                                  lock_mode="GOVERNANCE"), "credit", "v1", client=client_via(s3_server, s3_proxy))
    server = make_runtime(base_config(standin.url), RuntimeOptions(audit_sinks=[StdoutSink(stdout), sink]))
    s3_proxy.throttle_for(5)
    with server.client() as c:
        for n in range(100):
            c.post("/v1/decisions", json={"amount": n, "country": "US"}).raise_for_status()
    assert sink.waiting > 0  # still throttled: nothing confirmed yet
    eventually(lambda: sink.waiting == 0, 30, "the S3 copy complete after the throttling", interval=0.2)
    stored = lines_per_key(s3, bucket)
    assert s3_proxy.faults("slow_down") > 0 and sink.object_lock
    assert sorted(line for lines in stored.values() for line in lines) == sorted(stdout.getvalue().splitlines())
    assert all(key.startswith("audit/credit/v1/") for key in stored)  # retained, not the unretained path
    server.stop()
    assert server.runtime.audit_lost == {"stdout": 0, "s3": 0}


FAULTS = st.sampled_from(["pass", "ack_lost", "reset_after", "reset", "slow_down", "forbidden", "html_502",
                           "html_after", "cut_answer"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=st.lists(FAULTS, max_size=12), records=st.integers(1, 60), batch=st.integers(1, 25),
       lock=st.booleans())
def test_any_fault_schedule_ends_with_every_record_exactly_once(s3_server, s3_proxy, schedule, records, batch, lock):
    """Whatever S3 (or the path to it) does to each request in turn, once it behaves the bucket holds each line
    exactly once (per key, as a reader counts them, versions or not)."""
    s3 = s3_server.client()
    bucket = new_bucket(s3, lock)
    faults = iter(schedule)
    s3_proxy.fault = lambda request: next(faults, "pass")
    sink = S3BatchSink(S3Settings(bucket=bucket, batch_records=batch, retention_days=1 if lock else 0,
                                  lock_mode="GOVERNANCE"), "credit", "v1",
                       client=client_via(s3_server, s3_proxy, attempts=1))  # every retry is the sink's own
    lines = [json.dumps({"n": n, "id": uuid.uuid4().hex}) for n in range(records)]
    for i, line in enumerate(lines):
        sink.write(line)
        if i % 7 == 6:
            sink.flush()  # batches cut while faults are still coming
    for _ in range(len(schedule) + 3):
        if not sink.waiting:
            break
        sink.flush()
    assert sink.waiting == 0
    stored = lines_per_key(s3, bucket)
    in_s3 = [line for key_lines in stored.values() for line in key_lines]
    assert sorted(in_s3) == sorted(lines)
    assert all(key.startswith("audit/" if lock else "audit-unretained/") for key in stored)
