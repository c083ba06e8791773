"""vLLM's metrics re-exported by the runtime at /metrics/vllm (the PodMonitor's second endpoint): only `vllm:`
families, parseable by Prometheus' own text parser; an absent or hostile upstream gets a 503 with the reason or a
filtered body, never a 500."""

from __future__ import annotations

import asyncio
import http.server
from collections.abc import Iterator

import pytest
from arbiter_runtime.vllm_metrics import only_vllm, scrape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.http_stub import serving
from support.runtime_helpers import base_config


def test_runtime_reexports_vllm_families_with_kv_cache_and_queue_time(runtime, standin):
    with runtime.client() as http_client:
        http_client.post("/v1/decisions", json={"amount": 5.0, "country": "DE"})
        r = http_client.get("/metrics/vllm")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert "vllm:kv_cache_usage_perc" in families and "vllm:request_queue_time_seconds" in families
    assert all(name.startswith("vllm:") for name in families)  # vLLM's python_gc_* families are left out
    assert "python_gc" not in r.text


def test_upstream_down_is_503_with_reason(make_runtime, standin):
    server = make_runtime(base_config(standin.url))
    standin.stop()
    with server.client() as http_client:
        r = http_client.get("/metrics/vllm")
    assert r.status_code == 503 and "unreachable" in r.text


class _Hostile(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    with serving(_Hostile) as url:
        yield url


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=2000),
                      st.lists(st.sampled_from(["vllm:x 1", "# TYPE vllm:x gauge", "# HELP vllm:x h", "other 2",
                                                "vllm:", "# TYPE other counter", "\x00vllm:y 1",
                                                "vllm:z{a=\"\\n\"} 1"]),
                               max_size=20).map(lambda ls: "\n".join(ls).encode())),
       status=st.sampled_from([200, 200, 200, 404, 500]))
def test_hostile_upstream_metrics_never_leak_other_families_or_raise(hostile, body, status):
    _Hostile.body, _Hostile.status = body, status
    code, text = asyncio.run(scrape(hostile))
    if status != 200:
        assert code == 503 and str(status) in text
        return
    assert code == 200
    for line in text.splitlines():
        assert line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))


def test_filter_keeps_help_type_and_samples_of_vllm_only():
    text = "# HELP a x\n# TYPE a counter\na 1\n# HELP vllm:b y\n# TYPE vllm:b gauge\nvllm:b{m=\"q\"} 2\n"
    assert only_vllm(text) == "# HELP vllm:b y\n# TYPE vllm:b gauge\nvllm:b{m=\"q\"} 2\n"


def test_a_large_exposition_is_read_whole_and_one_past_the_bound_is_refused(hostile):
    """vLLM's /metrics of a busy server runs to hundreds of KiB, arriving over many reads: every family comes
    through, the last one too; a body past MAX_BYTES (said or sent) is a 503 naming the bound, never a cut one."""
    from arbiter_runtime.vllm_metrics import MAX_BYTES

    filler = "".join(f"other_{i} {i}\n" for i in range(60_000))  # about 1 MiB
    _Hostile.body, _Hostile.status = (filler + "vllm:last_family 7\n").encode(), 200
    code, text = asyncio.run(scrape(hostile))
    assert (code, text) == (200, "vllm:last_family 7\n")
    _Hostile.body = b"vllm:x 1\n" * (MAX_BYTES // 9 + 1)
    code, text = asyncio.run(scrape(hostile))
    assert code == 503 and f"larger than {MAX_BYTES} bytes" in text


_label_value = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=120, deadline=None)
@given(served=_label_value, other=_label_value, isvc=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       order=st.booleans())
def test_model_name_says_the_inferenceservice_and_nothing_else_changes(served, other, isvc, order):
    """OpenShift AI's metrics page selects vLLM's series by model_name = the InferenceService's name."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = [f'model_name="{esc(served)}"', f'engine="{esc(other)}"']
    if order:
        labels.reverse()
    text = (f"# HELP vllm:num_requests_running running\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{','.join(labels)}}} 2.0\nother_total{{model_name=\"x\"}} 1\n")
    out = only_vllm(text, isvc)
    (family,) = list(text_string_to_metric_families(out))
    (sample,) = family.samples
    assert sample.labels == {"model_name": isvc, "engine": other} and sample.value == 2.0
    # Without a name (an older pod spec) vLLM's own label passes unchanged.
    (kept,) = next(iter(text_string_to_metric_families(only_vllm(text)))).samples
    assert kept.labels["model_name"] == served
