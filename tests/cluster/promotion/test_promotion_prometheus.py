"""Canary analysis against a real Prometheus scraping workload stand-ins that carry real pods' target labels."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from arbiter_operator.api.promotion import Analysis, AnalysisRun, CanaryStep, PromoteSpec, PromotionStatus
from arbiter_operator.clients.prometheus import PrometheusClient, PrometheusConfig, PrometheusError
from arbiter_operator.observe.analysis import run_analysis
from arbiter_operator.promotion import AnalysisQuery, analysis_due
from support.promstack import PromStack

NS = "fraud"
MODEL = "claims"



@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = PromStack(tmp_path_factory.mktemp("prom"))
    try:
        s.start()
        stable = s.add_workload(NS, MODEL, "v1")
        cand = s.add_workload(NS, MODEL, "v2")
        # Same model and version name in another namespace, doing badly: must never leak into our numbers.
        other = s.add_workload("other-team", MODEL, "v2")
        stable.control(rps=40, latency_ms=900, error_rate=0.5)  # the stable is terrible: candidate-only queries
        cand.control(rps=40, latency_ms=40, error_rate=0.0)
        other.control(rps=40, latency_ms=900, error_rate=0.5)
        yield s
    finally:
        s.stop()


def query_for(version: str, sla_ms: float = 150.0, min_requests: int = 20, interval: int = 5,
              mode: str = "Windowed", since: int = 60) -> AnalysisQuery:
    spec = PromoteSpec(
        version=version,
        strategy="Canary",
        steps=[CanaryStep(weight=10, holdSeconds=0)],
        analysis=Analysis(intervalSeconds=interval, minRequests=min_requests, mode=mode),
    )
    now = datetime.now(UTC)
    started = (now - timedelta(seconds=since)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    status = PromotionStatus(
        phase="Progressing", stable="v1", candidate=version, step=0, weight=10, stepStartedAt=started
    )
    q = analysis_due(spec, status, now, namespace=NS, model=MODEL, sla_p95_ms=sla_ms)
    assert q is not None
    return q


async def until(make: Callable[[], AnalysisQuery], client: PrometheusClient, ok: Callable[[AnalysisRun], bool]):
    """Poll until Prometheus has scraped enough for the verdict to settle; return the last run."""
    run = None
    for _ in range(60):
        run = await run_analysis(client, make())
        if ok(run):
            return run
        await asyncio.sleep(0.5)
    pytest.fail(f"verdict never settled; last run: {run}")


async def test_pass_fail_and_no_data_from_real_metrics(stack):
    cand = stack.target(NS, MODEL, "v2")
    async with PrometheusClient(PrometheusConfig(url=stack.url)) as prom:
        # Healthy candidate (while the stable and the other namespace's pods are awful): Pass with its own numbers.
        run = await until(lambda: query_for("v2"), prom, lambda r: r.verdict == "Pass")
        assert 25 <= run.p95LatencyMs <= 50, run  # 40 ms observations, decision buckets 25..50 ms
        assert run.errorRate == 0 and run.requests >= 20 and run.p95BoundMs == 150 and run.windowSeconds == 5

        # Latency breach: p95 above the SLA bound fails, and says by how much.
        cand.control(latency_ms=400)
        run = await until(lambda: query_for("v2"), prom, lambda r: r.verdict == "Fail")
        assert run.p95LatencyMs > 150 and "p95 latency above bound" in run.message and "bound 150.0ms" in run.message

        # Error-rate breach with good latency.
        cand.control(latency_ms=40, error_rate=0.2)
        run = await until(
            lambda: query_for("v2"), prom, lambda r: r.verdict == "Fail" and (r.p95LatencyMs or 999) < 150
        )
        assert 0.1 <= run.errorRate <= 0.3 and "error rate above maxErrorRate" in run.message

        # Traffic stops: too few requests is NoData, never a pass.
        cand.control(rps=0, error_rate=0.0)
        run = await until(lambda: query_for("v2"), prom, lambda r: r.verdict != "Fail" and r.requests is not None)
        assert run.verdict == "NoData" and run.requests < 20 and "fewer than minRequests=20" in run.message
        cand.control(rps=40)


async def test_sequential_reads_both_versions_counts_and_histograms_since_the_step_began(stack):
    # Everything since the step began (20 s ago), both versions: the candidate is judged against the stable version's
    # counts (here awful: 900 ms, half its decisions failing), and against its own bounds.
    cand = stack.target(NS, MODEL, "v2")

    def sequential():
        return query_for("v2", mode="Sequential", since=20)

    async with PrometheusClient(PrometheusConfig(url=stack.url)) as prom:
        def counted_since_the_step_began(r: AnalysisRun) -> bool:
            # More than a 5 s window holds at 40/s; on a busy machine Prometheus may miss scrapes for a while, and
            # increase() over a sparse window reads low, so the counts are awaited, not read once.
            errors = rows_of(r)["errorRate"].evidence if r.verdict == "Pass" else None
            return errors is not None and errors.stableDecisions > 200 and errors.decisions > 200

        run = await until(sequential, prom, counted_since_the_step_began)
        assert run.mode == "Sequential" and run.windowSeconds == 19
        rows = {c.name: c for c in run.checks}
        errors, slow = rows["errorRate"].evidence, rows["p95LatencyMs"].evidence
        assert errors.estimate == pytest.approx(-0.5, abs=0.05)  # 0% against the stable's 50%
        assert slow.estimate == pytest.approx(-1.0, abs=0.01)  # none slower than 150 ms, against all of the stable's
        assert rows["decisionMixShift"].evidence.stableDecisions > 0
        # Better than an awful stable version is not enough: its own error rate above maxErrorRate fails it.
        cand.control(error_rate=0.2)
        try:
            run = await until(sequential, prom, lambda r: r.verdict == "Fail")
        finally:
            cand.control(error_rate=0.0)
        assert "above max 1.00%" in rows_of(run)["errorRate"].message


def rows_of(run: AnalysisRun) -> dict:
    return {c.name: c for c in run.checks}


async def test_a_version_without_any_series_is_no_data(stack):
    async with PrometheusClient(PrometheusConfig(url=stack.url)) as prom:
        run = await run_analysis(prom, query_for("v7"))
    assert run.verdict == "NoData" and run.requests is None and "no decision metrics" in run.message


async def test_unreachable_prometheus_is_inconclusive():
    async with PrometheusClient(PrometheusConfig(url="http://127.0.0.1:9", timeout_seconds=2)) as prom:
        run = await run_analysis(prom, query_for("v2"))
    assert run.verdict == "Inconclusive" and "127.0.0.1:9" in run.message


def test_rejected_token_is_explained_without_leaking_it():
    seen: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            seen["auth"] = self.headers.get("Authorization", "")
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status":"error","error":"forbidden"}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "sha256~very-secret-token"
    cfg = PrometheusConfig(url=f"http://127.0.0.1:{server.server_address[1]}", token=secret)
    assert secret not in repr(cfg)

    async def go():
        async with PrometheusClient(cfg) as prom:
            with pytest.raises(PrometheusError) as err:
                await prom.query("up")
            return str(err.value)

    try:
        message = asyncio.run(go())
    finally:
        server.shutdown()
    assert seen["auth"] == f"Bearer {secret}"
    assert "HTTP 403" in message and "cluster-monitoring-view" in message and secret not in message


def test_config_from_secret_defaults_to_thanos_querier():
    import base64

    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    cfg = PrometheusConfig.from_secret_data({"token": b64("abc\n")})
    assert cfg.url == "https://thanos-querier.openshift-monitoring.svc:9092" and cfg.token == "abc" and cfg.verify
    assert cfg.tenancy  # the tenancy port answers one namespace per query
    cfg = PrometheusConfig.from_secret_data({"url": b64("http://prom:9090"), "token": b64("t")})
    assert cfg.url == "http://prom:9090" and not cfg.tenancy


def _self_signed(tmp_path):
    """A CA and a server certificate for 127.0.0.1 signed by it (what the OpenShift service CA does for services)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test service CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "thanos-querier")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(pem))
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca.public_bytes(pem).decode(), tmp_path / "tls.crt", tmp_path / "tls.key"


async def test_tls_is_verified_against_the_configured_ca(tmp_path):
    ca_pem, cert, key = _self_signed(tmp_path)
    s = PromStack(tmp_path, tls=(cert, key))
    s.start()
    try:
        async with PrometheusClient(PrometheusConfig(url=s.url, ca_pem=ca_pem)) as prom:
            assert await prom.query("vector(1)") == [({}, 1.0)]
        # Without the CA the server is not trusted: no numbers, an Inconclusive analysis that says why.
        async with PrometheusClient(PrometheusConfig(url=s.url)) as prom:
            run = await run_analysis(prom, query_for("v2"))
        assert run.verdict == "Inconclusive" and "CERTIFICATE_VERIFY_FAILED" in run.message
        ca_file = tmp_path / "service-ca.crt"
        ca_file.write_text(ca_pem)
        cfg = PrometheusConfig.from_env({"ARBITER_PROMETHEUS_URL": s.url, "ARBITER_PROMETHEUS_CA_FILE": str(ca_file)})
        async with PrometheusClient(cfg) as prom:
            assert await prom.query("vector(2)") == [({}, 2.0)]
    finally:
        s.stop()


def test_token_file_is_reread_so_rotated_tokens_keep_working(tmp_path):
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            seen.append(self.headers.get("Authorization", ""))
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("first\n")
    cfg = PrometheusConfig.from_env(
        {"ARBITER_PROMETHEUS_URL": f"http://127.0.0.1:{server.server_address[1]}",
         "ARBITER_PROMETHEUS_TOKEN_FILE": str(token)}
    )

    async def go():
        async with PrometheusClient(cfg) as prom:
            assert await prom.query("up") == []
            token.write_text("second\n")
            assert await prom.query("up") == []

    try:
        asyncio.run(go())
    finally:
        server.shutdown()
    assert seen == ["Bearer first", "Bearer second"]
