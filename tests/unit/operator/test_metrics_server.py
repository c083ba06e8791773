"""The operator's metrics server (metrics_server.py) on loopback, with the apiserver's reviews played by a stand-in:
HTTPS from a certificate directory that rotates, 401/403/503 before any metric is read, prometheus_client's page and
its content negotiation, and a hostile scraper's raw bytes answered with a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import uvloop
from arbiter_operator import metrics_server
from arbiter_operator.kube import authn
from arbiter_operator.metrics_server import MetricsConfig, MetricsServer, ServingCert
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.review_standin import ALLOWED, TOKEN, USER, Apiserver, review
from support.webhook_kit import serving_certificate

STRANGER = "stranger-token"


def _apiserver_answers() -> dict[str, Any]:
    """Both tokens are authenticated; only TOKEN's user may get /metrics."""
    def tokenreview(doc: dict[str, Any]) -> tuple[int, bytes]:
        name = USER["username"] if doc["spec"]["token"] == TOKEN else "system:serviceaccount:team-a:stranger"
        return review({"authenticated": True, "user": {**USER, "username": name}})

    def access(doc: dict[str, Any]) -> tuple[int, bytes]:
        return review({"allowed": doc["spec"]["user"] == USER["username"]})

    return {authn.TOKENREVIEWS: tokenreview, authn.SUBJECTACCESSREVIEWS: access}


class Served:
    def __init__(self, server: MetricsServer, api: Apiserver | None, ca: bytes | None) -> None:
        self.server, self.api, self.ca = server, api, ca
        scheme = "https" if ca else "http"
        self.url = f"{scheme}://127.0.0.1:{server.port}/metrics"

    def client_ssl(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cadata=self.ca.decode()) if self.ca else False

    async def get(self, headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession(auto_decompress=kw.pop("decompress", True)) as http:
            async with http.get(self.url, headers=headers or {}, ssl=self.client_ssl(), **kw) as resp:
                return resp.status, dict(resp.headers), await resp.read()


async def _start(tmp: Path, *, auth: bool = True, tls: bool = True, api: Apiserver | None = None) -> Served:
    ca = serving_certificate(tmp / "tls") if tls else None
    cert = ServingCert(tmp / "tls") if tls else None
    api = api or Apiserver(_apiserver_answers())
    reviewer = authn.Reviewer(api, authn.NonResource("/metrics", "get")) if auth else None
    server = await MetricsServer(MetricsConfig(port=0, address="127.0.0.1", cert=cert, auth=auth), reviewer).start()
    return Served(server, api if auth else None, ca)


@pytest_asyncio.fixture(loop_scope="function")  # the test's own loop: the server must run where it is called
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    s = await _start(tmp_path)
    try:
        yield s
    finally:
        await s.server.stop()


async def test_no_token_is_401_with_a_bearer_challenge_and_no_review(served: Served) -> None:
    status, headers, body = await served.get()
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer ") and headers["Content-Type"] == "application/json"
    assert b"Authorization: Bearer" in body
    assert served.api is not None and served.api.sent == []


async def test_a_token_without_the_grant_is_403_and_one_with_it_reads_the_page(served: Served) -> None:
    status, _, body = await served.get({"Authorization": f"Bearer {STRANGER}"})
    assert status == 403 and b"system:serviceaccount:team-a:stranger" in body and STRANGER.encode() not in body
    status, headers, body = await served.get({"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    # prometheus_client's default registry: its own collectors and the operator's.
    assert headers["Content-Type"].startswith("text/plain; version=")
    text = body.decode()
    assert "# TYPE python_info gauge" in text and "arbiter_operator_reconcile_total" in text
    await served.get({"Authorization": f"Bearer {TOKEN}"})
    assert served.api is not None and len(served.api.sent) == 4  # two per token: the second scrape was kept


async def test_openmetrics_and_gzip_as_prometheus_client_serves_them(served: Served) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, headers, body = await served.get({**auth, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    status, headers, body = await served.get({**auth, "Accept-Encoding": "gzip"}, decompress=False)
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert b"arbiter_operator_" in gzip.decompress(body)


async def test_an_apiserver_that_cannot_judge_is_503_with_retry_after(tmp_path: Path) -> None:
    s = await _start(tmp_path, api=Apiserver({**ALLOWED, authn.TOKENREVIEWS: TimeoutError()}))
    try:
        status, headers, body = await s.get({"Authorization": f"Bearer {TOKEN}"})
    finally:
        await s.server.stop()
    assert status == 503 and headers["Retry-After"] == "1" and b"did not answer" in body


async def test_a_collector_that_raises_is_503_not_500(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_registry: Any) -> bytes:
        raise ValueError("a collector failed")

    monkeypatch.setattr(metrics_server, "choose_encoder", lambda _accept: (broken, "text/plain"))
    status, _, body = await served.get({"Authorization": f"Bearer {TOKEN}"})
    assert status == 503 and b"could not be collected (ValueError)" in body


async def test_other_paths_and_methods_are_refused_without_a_review(served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        base = served.url.rsplit("/", 1)[0]
        async with http.get(f"{base}/healthz", ssl=served.client_ssl()) as resp:
            assert resp.status == 404
        async with http.post(served.url, data=b"x", ssl=served.client_ssl()) as resp:
            assert resp.status == 405
    assert served.api is not None and served.api.sent == []


async def test_with_auth_off_anyone_reads_and_without_a_cert_it_is_plain_http(tmp_path: Path) -> None:
    s = await _start(tmp_path, auth=False, tls=False)
    try:
        assert s.url.startswith("http://")
        status, _, body = await s.get()
    finally:
        await s.server.stop()
    assert status == 200 and b"arbiter_operator_" in body


async def _raw(s: Served, head: bytes) -> bytes:
    """Send `head` as the request's bytes on a fresh TLS connection; the status line of the answer (b"" if none)."""
    ctx = s.client_ssl()
    assert isinstance(ctx, ssl.SSLContext)
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


def _request(authorization: bytes) -> bytes:
    return b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization + b"\r\nConnection: close\r\n\r\n"


async def test_oversized_tokens_get_the_filters_401_then_the_parsers_400(served: Served) -> None:
    over = b"Bearer " + b"a" * (authn.MAX_TOKEN_BYTES + 1)
    assert (await _raw(served, _request(over))).startswith(b"HTTP/1.1 401")
    huge = b"Bearer " + b"a" * (metrics_server.MAX_FIELD_BYTES + 1)
    assert (await _raw(served, _request(huge))).split(b" ")[1] in (b"400", b"431")
    assert served.api is not None and served.api.sent == []


_header_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda b: b"Bearer " + b, st.binary(max_size=300)),
    st.builds(lambda t: b"Bearer " + t.encode(), st.text(alphabet="abcXYZ019-._~+/= \t,;", min_size=1,
                                                          max_size=200)),
    st.sampled_from([b"Bearer " + TOKEN.encode(), b"Bearer " + STRANGER.encode(), b"bearer", b"Bearer  ",
                     b"Bearer " + TOKEN.encode() + b"\r\nAuthorization: Bearer " + STRANGER.encode()]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_header_bytes)
async def test_any_authorization_bytes_get_an_answer_never_a_500(served: Served, value: bytes) -> None:
    if b"\r" in value or b"\n" in value:
        value = value.replace(b"\r", b"").replace(b"\n", b"")  # one header (the two-header case is kept whole)
        if value.startswith(b"Bearer " + TOKEN.encode() + b"Authorization"):
            value = b"Bearer " + TOKEN.encode() + b"\r\nAuthorization: Bearer " + STRANGER.encode()
    line = await _raw(served, _request(value))
    code = line.split(b" ")[1] if line.count(b" ") >= 2 else b""
    assert code in (b"200", b"400", b"401", b"403"), (value, line)


# -- certificate rotation ---------------------------------------------------------------------------------------


async def _peer_certificate(port: int, sni: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=sni or "127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return bytes(der)
    finally:
        writer.close()


def _der(directory: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert((directory / "tls.crt").read_text())


async def _rotation(tmp_path: Path) -> None:
    s = await _start(tmp_path)
    tls = tmp_path / "tls"
    try:
        first = _der(tls)
        assert await _peer_certificate(s.server.port, None) == first
        cert = s.server.config.cert
        assert cert is not None and cert.refresh() is False  # unchanged files: nothing reloaded
        # A rotation caught half-way (the new certificate, the old key): the old pair stays in use.
        old_key = (tls / "tls.key").read_bytes()
        serving_certificate(tmp_path / "next")
        shutil.copy(tmp_path / "next" / "tls.crt", tls / "tls.crt")
        assert cert.refresh() is False
        assert await _peer_certificate(s.server.port, None) == first
        # The key follows: the new pair is served to new connections, with SNI and without.
        shutil.copy(tmp_path / "next" / "tls.key", tls / "tls.key")
        assert old_key != (tls / "tls.key").read_bytes()
        assert cert.refresh() is True
        second = _der(tls)
        assert second != first
        assert await _peer_certificate(s.server.port, None) == second
        assert await _peer_certificate(s.server.port, "arbiter-metrics.arbiter-system.svc") == second
        # Files that vanish (a Secret deleted) leave the last good pair serving.
        (tls / "tls.key").unlink()
        assert cert.refresh() is False
        assert await _peer_certificate(s.server.port, None) == second
    finally:
        await s.server.stop()


async def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    await _rotation(tmp_path)


def test_a_rotated_certificate_is_served_on_the_operators_uvloop(tmp_path: Path) -> None:
    # uvloop's TLS is its own: the handshake callback must hand over the new certificate there too.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_rotation(tmp_path))


async def test_the_server_follows_the_files_on_its_own(tmp_path: Path) -> None:
    serving_certificate(tmp_path / "tls")
    cert = ServingCert(tmp_path / "tls")
    task = asyncio.create_task(cert.follow(interval=0.01))
    try:
        serving_certificate(tmp_path / "tls")
        for _ in range(200):
            if cert._digest == cert._read_digest():
                break
            await asyncio.sleep(0.01)
        assert cert._digest == cert._read_digest()
    finally:
        task.cancel()


def test_a_missing_or_broken_pair_stops_the_operator_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ServingCert(tmp_path / "absent")
    serving_certificate(tmp_path / "tls")
    (tmp_path / "tls" / "tls.key").write_text("not a key")
    with pytest.raises(ssl.SSLError):
        ServingCert(tmp_path / "tls")


# -- the operator's flags ----------------------------------------------------------------------------------------


def test_auth_is_on_by_default_and_plain_http_only_without_a_cert_dir(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from arbiter_operator import __main__ as cli

    for env in ("ARBITER_METRICS_AUTH", "ARBITER_METRICS_CERT_DIR", "ARBITER_METRICS_READER_SECRET"):
        monkeypatch.delenv(env, raising=False)
    parser = cli._parser()
    args = parser.parse_args(["--metrics-port", "9090"])
    assert args.metrics_auth is True and args.metrics_cert_dir == ""
    assert args.metrics_reader_secret == "arbiter-metrics-reader"
    config = cli._metrics(parser, args)
    assert config is not None and config.auth and config.cert is None  # plain HTTP: no cert dir was given
    assert cli._metrics(parser, parser.parse_args([])) is None  # no port: no server
    for word, value in (("false", False), ("False", False), ("0", False), ("true", True), ("on", True)):
        assert parser.parse_args([f"--metrics-auth={word}"]).metrics_auth is value
    monkeypatch.setenv("ARBITER_METRICS_AUTH", "false")
    assert cli._parser().parse_args([]).metrics_auth is False
    serving_certificate(tmp_path / "tls")
    args = parser.parse_args(["--metrics-port", "9090", f"--metrics-cert-dir={tmp_path / 'tls'}"])
    config = cli._metrics(parser, args)
    assert config is not None and config.cert is not None  # a cert dir: HTTPS, never plain HTTP


@pytest.mark.parametrize("argv", [["--metrics-auth=maybe"], ["--metrics-reader-secret=Not_A_Name"],
                                  ["--metrics-port=9090", "--metrics-cert-dir=/nonexistent"]])
def test_bad_metrics_flags_stop_the_operator_naming_them(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from arbiter_operator import __main__ as cli

    parser = cli._parser()
    with pytest.raises(SystemExit):
        cli._metrics(parser, parser.parse_args(argv))
    assert argv[-1].split("=")[0] in capsys.readouterr().err


def test_the_reader_secret_flag_reaches_the_plans_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from arbiter_operator import __main__ as cli
    from arbiter_operator import settings as operator_settings

    monkeypatch.setenv("ARBITER_METRICS_READER_SECRET", "")  # recorded: what _checked writes is undone afterwards
    assert operator_settings.metrics_reader_secret() == "arbiter-metrics-reader"
    parser = cli._parser()
    cli._checked(parser, parser.parse_args(["--metrics-reader-secret=team-prometheus"]))
    assert operator_settings.metrics_reader_secret() == "team-prometheus"
