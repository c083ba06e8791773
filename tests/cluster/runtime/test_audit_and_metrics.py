"""Audit records (stdout and S3 on the real S3 server) and the Prometheus names the promotion analysis queries."""

from __future__ import annotations

import hashlib
import io
import json
import uuid

import pytest
from arbiter_runtime.audit import S3BatchSink, S3Settings, StdoutSink, trace_from_header
from arbiter_runtime.service import RuntimeOptions
from support.polling import eventually
from support.runtime_helpers import base_config, v2_body

CASE = {"amount": 1200, "country": "DE"}
SECRET_VALUE = "Mustermann-4711"


def test_one_record_per_decision_with_digest_not_input(runtime, standin):
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    doc = {"amount": 75, "country": "DE", "applicant": {"age": 40}}
    with runtime.client() as c:
        c.post("/v2/models/credit/infer", json=v2_body(CASE, doc, id="r-9"),
               headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}).raise_for_status()
        standin.set("failing")
        c.post("/v1/decisions", json={"amount": 20000, "country": "DE"}).raise_for_status()
    records = runtime.records()
    assert len(records) == 3
    model_records = sorted(records[:2], key=lambda r: r["row"])
    for record, document in zip(model_records, [CASE, doc], strict=True):
        assert record["traceId"] == trace and record["parentSpanId"] == "00f067aa0ba902b7"
        assert record["requestId"] == "r-9" and record["model"] == "credit" and record["version"] == "v1"
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert record["inputDigest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        assert record["source"] == "model" and record["decision"] in ("approve", "deny", "review")
        assert len(record["trajectory"]["steps"]) == 2 and record["latencyMs"] > 0
        assert "input" not in record and "amount" not in json.dumps(record)
    rules = records[2]
    assert rules["source"] == "rules" and rules["rule"] == "large-amount"
    assert rules["fallbackReason"] == "upstream_error"
    assert rules["traceId"] != trace and len(rules["traceId"]) == 32


def test_raw_input_never_reaches_the_audit(runtime):
    with runtime.client() as c:
        c.post("/v1/decisions", json={"amount": 5, "country": "DE", "applicant": {"age": 33}}).raise_for_status()
        c.post("/v1/decisions", json={"amount": 5, "country": SECRET_VALUE[:2]}).raise_for_status()
    assert "33" not in json.dumps([r.get("inputDigest") for r in runtime.records()])
    assert all("applicant" not in json.dumps(r) for r in runtime.records())


def test_traceparent_parsing():
    t = trace_from_header("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert t.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and t.parent_id == "00f067aa0ba902b7"
    assert t.traceparent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and t.span_id != t.parent_id
    for bad in [None, "", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]:
        fresh = trace_from_header(bad)
        assert fresh.parent_id is None and len(fresh.trace_id) == 32 and fresh.trace_id != "0" * 32


def _bucket(s3, lock: bool) -> str:
    name = f"audit-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=lock) if lock else s3.create_bucket(Bucket=name)
    return name


def _objects(s3, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _lines(s3, bucket: str) -> list[dict]:
    out = []
    for key in _objects(s3, bucket):
        out += [json.loads(x) for x in s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()]
    return out


def test_s3_batches_are_flushed_on_clean_shutdown(s3_server, standin, make_runtime):
    s3 = s3_server.client()
    bucket = _bucket(s3, lock=False)
    stdout = io.StringIO()
    sink = S3BatchSink(S3Settings(bucket=bucket, prefix="audit", batch_records=1000, interval_s=3600), "credit", "v1",
                       client=s3)
    server = make_runtime(base_config(standin.url), RuntimeOptions(audit_sinks=[StdoutSink(stdout), sink]))
    with server.client() as c:
        for n in range(5):
            c.post("/v1/decisions", json={"amount": n, "country": "DE"}).raise_for_status()
    assert _objects(s3, bucket) == []  # still batching
    server.stop()
    keys = _objects(s3, bucket)
    # a bucket without object lock: the records are under the prefix that says they have no retention
    assert len(keys) == 1 and keys[0].startswith("audit-unretained/credit/v1/") and keys[0].endswith(".jsonl")
    uploaded = _lines(s3, bucket)
    on_stdout = [json.loads(x) for x in stdout.getvalue().splitlines()]
    assert uploaded == on_stdout and len(uploaded) == 5


def test_s3_batches_upload_while_running_with_object_lock_retention(s3_server, standin, make_runtime):
    s3 = s3_server.client()
    bucket = _bucket(s3, lock=True)
    sink = S3BatchSink(S3Settings(bucket=bucket, batch_records=2, interval_s=0.2, retention_days=30,
                                  lock_mode="GOVERNANCE"), "credit", "v1", client=s3)
    server = make_runtime(base_config(standin.url), RuntimeOptions(audit_sinks=[StdoutSink(io.StringIO()), sink]))
    with server.client() as c:
        for n in range(4):
            c.post("/v1/decisions", json={"amount": n, "country": "US"}).raise_for_status()
    eventually(lambda: len(_lines(s3, bucket)) >= 4, 30, "four audit objects on S3", interval=0.05)
    assert sink.object_lock is True
    assert len(_lines(s3, bucket)) == 4  # uploaded before any shutdown
    key = _objects(s3, bucket)[0]
    retention = s3.get_object_retention(Bucket=bucket, Key=key)["Retention"]
    assert retention["Mode"] == "GOVERNANCE"
    server.stop()


def test_s3_failure_keeps_records_for_the_next_try(s3_server):
    s3 = s3_server.client()
    sink = S3BatchSink(S3Settings(bucket=f"missing-{uuid.uuid4().hex[:8]}"), "credit", "v1", client=s3)
    sink.write('{"n":1}')
    assert sink.flush() == 0 and sink.failures == 1
    s3.create_bucket(Bucket=sink.s.bucket)
    assert sink.flush() == 1
    assert _lines(s3, sink.s.bucket) == [{"n": 1}]


def test_s3_settings_from_env():
    assert S3Settings.from_env({}) is None
    s = S3Settings.from_env({"ARBITER_AUDIT_S3_BUCKET": "b", "ARBITER_AUDIT_S3_ENDPOINT": "http://s3:9000",
                             "ARBITER_AUDIT_S3_RETENTION_DAYS": "2555", "ARBITER_AUDIT_S3_PREFIX": "/x/"})
    assert (s.bucket, s.endpoint_url, s.retention_days, s.prefix) == ("b", "http://s3:9000", 2555, "x")
    with pytest.raises(ValueError):
        S3Settings.from_env({"ARBITER_AUDIT_S3_BUCKET": "b", "ARBITER_AUDIT_S3_LOCK_MODE": "loose"})


def test_metric_names_and_labels(runtime, standin):
    with runtime.client() as c:
        c.post("/v1/decisions", json=CASE).raise_for_status()
        standin.set("invalid")
        c.post("/v1/decisions", json={"amount": 1, "country": "US"}).raise_for_status()
        text = c.get("/metrics").text
    assert 'arbiter_decisions_total{model="credit",outcome="ok",source="model",version="v1"}' in text or \
        'arbiter_decisions_total{model="credit",outcome="low_confidence",source="model",version="v1"} 1.0' in text
    assert 'arbiter_decisions_total{model="credit",outcome="fallback",source="rules",version="v1"} 1.0' in text
    assert 'arbiter_decision_latency_seconds_bucket{le="0.1",model="credit",version="v1"}' in text
    assert 'arbiter_decision_latency_seconds_count{model="credit",version="v1"} 2.0' in text
    assert 'arbiter_schema_violations_total{kind="format",model="credit",version="v1"} 3.0' in text
    assert 'arbiter_fallbacks_total{model="credit",reason="invalid",version="v1"} 1.0' in text
    assert 'arbiter_upstream_errors_total{kind="connect",model="credit",version="v1"} 0.0' in text


def test_s3_records_without_retention_go_to_a_marked_path(s3_server):
    s3 = s3_server.client()
    bucket = _bucket(s3, lock=False)
    sink = S3BatchSink(S3Settings(bucket=bucket, prefix="audit", retention_days=30), "credit", "v1", client=s3)
    sink._check_retention()
    sink.write('{"n":1}')
    assert sink.flush() == 1 and sink.retention == "unlocked"
    assert all(key.startswith("audit-unretained/credit/v1/") for key in _objects(s3, bucket))
    assert _lines(s3, bucket) == [{"n": 1}]


def test_s3_retention_is_verified_after_an_outage_before_records_are_written(s3_server):
    """S3 unusable at start-up: records wait (never written without the check), then land with retention."""
    s3 = s3_server.client()
    bucket = f"audit-{uuid.uuid4().hex[:12]}"
    sink = S3BatchSink(S3Settings(bucket=bucket, prefix="audit", retention_days=1, lock_mode="GOVERNANCE"),
                       "credit", "v1", client=s3)
    sink._check_retention()  # the bucket does not answer yet
    assert sink.retention is None
    sink.write('{"n":1}')
    sink.write('{"n":2}')
    assert sink.flush() == 0 and sink.failures >= 1  # kept, not written anywhere
    s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    assert sink.flush() == 2 and sink.retention == "locked"
    (key,) = _objects(s3, bucket)
    assert key.startswith("audit/credit/v1/")
    assert s3.get_object_retention(Bucket=bucket, Key=key)["Retention"]["Mode"] == "GOVERNANCE"
    assert _lines(s3, bucket) == [{"n": 1}, {"n": 2}]
