"""SIGTERM on the real decision-server process: the audit is flushed within the grace period (S3 retried until it
recovers), and the exit code is non-zero, with the count per sink in the log, whenever a record did not make it."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
from support.edge_kit import ServeProc

LOST = re.compile(r"audit records not written at shutdown: stdout (\d+), s3 (\d+) \(of (\d+) recorded\)"
                  r"|audit records not written at shutdown: stdout (\d+) \(of (\d+) recorded\)")


def decide(served: ServeProc, n: int) -> list[str]:
    """n decisions, each answered 200: their trace ids."""
    answers = [served.decide({"amount": i, "country": "DE"}) for i in range(n)]
    assert all(status == 200 for status, _ in answers), answers[:3]
    return [body["traceId"] for _, body in answers]


@pytest.fixture
def serve(tmp_path, standin):
    """`serve(env, stdout)`: the real decision server as a process, its audit on `stdout`, auth off."""
    started: list[ServeProc] = []

    def start(env: dict[str, str], stdout) -> ServeProc:
        served = ServeProc(tmp_path, standin.url, env={"ARBITER_AUTH": "false", **env}, stdout=stdout)
        started.append(served)
        return served.start()

    yield start
    for served in started:
        served.stop()


def test_stdout_never_drained_exits_non_zero_and_says_how_many(serve):
    served = serve({"ARBITER_SHUTDOWN_GRACE_S": "4"}, subprocess.PIPE)  # a pipe nobody reads
    decide(served, 300)  # answered all the same: the records wait in the queue
    rc, took = served.terminate(15)
    out = served.proc.stdout.read()
    complete = out.count(b"\n")
    found = LOST.search(served.log())
    assert rc == 4 and found, served.log()
    assert int(found[4]) == 300 - complete > 0 and int(found[5]) == 300
    assert took < 4 + 1  # bounded by the grace period, not by the reader
    assert all(json.loads(line)["kind"] == "arbiter.decision" for line in out.splitlines()[:complete])


@pytest.fixture
def serve_with_s3(tmp_path, serve, s3_server, s3_proxy):
    """A decision server whose S3 copy goes through the fault proxy to a new bucket, its stdout in audit.jsonl:
    `start(grace)` gives (served, bucket)."""
    opened = []

    def start(grace: float) -> tuple[ServeProc, str]:
        bucket = f"audit-{uuid.uuid4().hex[:12]}"
        s3_server.client().create_bucket(Bucket=bucket)
        opened.append(open(tmp_path / "audit.jsonl", "wb"))  # the child writes it until its end
        env = {"ARBITER_AUDIT_S3_BUCKET": bucket, "ARBITER_AUDIT_S3_ENDPOINT": s3_proxy.endpoint_url,
               "ARBITER_AUDIT_S3_INTERVAL_S": "3600",  # nothing uploads before the SIGTERM
               "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
               "AWS_REGION": s3_server.region, "ARBITER_SHUTDOWN_GRACE_S": str(grace)}
        return serve(env, opened[-1]), bucket

    yield start
    for stdout in opened:
        stdout.close()


def _traces_in(s3, bucket: str) -> list[str]:
    out = []
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
        out += [json.loads(line)["traceId"] for line in body.splitlines()]
    return out


def test_sigterm_while_s3_throttles_waits_for_it_and_loses_nothing(serve_with_s3, s3_server, s3_proxy):
    served, bucket = serve_with_s3(grace=15)
    traces = decide(served, 70)
    s3_proxy.throttle_for(5)
    rc, took = served.terminate(20)
    assert rc == 0, served.log()
    assert took > 4  # it waited for S3 to recover, retrying, rather than exit at once without the S3 copy
    assert s3_proxy.faults("slow_down") >= 2
    assert sorted(_traces_in(s3_server.client(), bucket)) == sorted(traces)  # all 70, each once
    assert "audit: all 70 records written to stdout, s3" in served.log()


def test_s3_down_past_the_grace_period_exits_non_zero_with_the_count(tmp_path, serve_with_s3, s3_proxy):
    served, _ = serve_with_s3(grace=3)
    decide(served, 20)
    s3_proxy.throttle_for(600)
    rc, took = served.terminate(15)
    found = LOST.search(served.log())
    assert rc == 4 and found, served.log()
    assert (found[1], found[2], found[3]) == ("0", "20", "20")  # stdout has them all, S3 none
    assert took < 3 + 1
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 20
