"""KServe's Python SDK and tritonclient, with their defaults, as real clients of a real decision-server process (in
front of the vLLM stand-in): binary BYTES inputs, binary outputs on and off, compressed bodies, readiness."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import kserve
import numpy as np
import pytest
import tritonclient.http as triton
from support.polling import eventually
from support.runtime_procs import CASES, RuntimeFleet
from tritonclient.utils import InferenceServerException

ROWS = CASES[:3]


@pytest.fixture(scope="module")
def proc(tmp_path_factory):
    with RuntimeFleet(tmp_path_factory.mktemp("sdk")) as fleet:
        yield fleet.start_version("v1")


@pytest.fixture(scope="module")
def expected(proc) -> dict[str, list]:
    """What the plain JSON form of V2 answers for ROWS: every SDK call must get the same."""
    return {o["name"]: o["data"] for o in proc.infer(ROWS)["outputs"]}


def _docs() -> np.ndarray:
    return np.array([json.dumps(r).encode() for r in ROWS], dtype=np.object_)


def _texts(values) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def _triton_input() -> triton.InferInput:
    tensor = triton.InferInput("input", [len(ROWS)], "BYTES")
    tensor.set_data_from_numpy(_docs())  # binary_data=True: the extension, the SDK's default
    return tensor


def test_tritonclient_defaults_are_answered(proc, expected):
    client = triton.InferenceServerClient(f"127.0.0.1:{proc.port}")
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("credit")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        result = client.infer("credit", [_triton_input()])  # no outputs named: binary_data_output is sent
        meta = {o["name"]: o for o in result.get_response()["outputs"]}
        assert all("binary_data_size" in o["parameters"] and "data" not in o for o in meta.values())
        assert _texts(result.as_numpy("decision")) == expected["decision"]
        assert _texts(result.as_numpy("trajectory")) == expected["trajectory"]
        assert result.as_numpy("confidence").tolist() == pytest.approx(expected["confidence"], rel=1e-6)
        assert result.as_numpy("low_confidence").tolist() == expected["low_confidence"]

        mixed = client.infer("credit", [_triton_input()], outputs=[
            triton.InferRequestedOutput("decision", binary_data=False),
            triton.InferRequestedOutput("source")])  # binary_data=True by default
        meta = {o["name"]: o for o in mixed.get_response()["outputs"]}
        assert list(meta) == ["decision", "source"]
        assert meta["decision"]["data"] == expected["decision"] and "binary_data_size" in meta["source"]["parameters"]
        assert _texts(mixed.as_numpy("source")) == expected["source"]
    finally:
        client.close()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_tritonclient_compressed_requests_are_decoded(proc, expected, compression):
    client = triton.InferenceServerClient(f"127.0.0.1:{proc.port}")
    try:
        result = client.infer("credit", [_triton_input()], request_compression_algorithm=compression,
                              response_compression_algorithm=compression)
        assert _texts(result.as_numpy("decision")) == expected["decision"]
    finally:
        client.close()


def test_tritonclient_hears_the_servers_400(proc):
    client = triton.InferenceServerClient(f"127.0.0.1:{proc.port}")
    tensor = triton.InferInput("input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps({"amount": -1, "country": "DE"}).encode()], dtype=np.object_))
    try:
        with pytest.raises(InferenceServerException, match="amount") as err:
            client.infer("credit", [tensor])
        assert err.value.status() == "400"
    finally:
        client.close()


async def _kserve_calls(url: str) -> dict[str, kserve.InferResponse]:
    async with kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2")) as client:
        assert await client.is_server_live(url) and await client.is_server_ready(url)
        assert await client.is_model_ready(url, "credit")
        answers = {}
        for case, binary_in, params, requested in [
            ("default", True, None, None),
            ("binary out", True, {"binary_data_output": True}, None),
            ("json in, one binary out", False, None,
             [kserve.protocol.infer_type.RequestedOutput("decision", parameters={"binary_data": True}),
              kserve.protocol.infer_type.RequestedOutput("confidence")]),
        ]:
            tensor = kserve.InferInput("input", [len(ROWS)], "BYTES")
            tensor.set_data_from_numpy(_docs(), binary_data=binary_in)
            request = kserve.InferRequest("credit", [tensor], parameters=params, request_outputs=requested)
            answers[case] = await client.infer(url, request, model_name="credit")
        return answers


def test_kserve_sdk_defaults_are_answered(proc, expected):
    answers = asyncio.run(_kserve_calls(proc.url))
    for case, answer in answers.items():
        got = {o.name: o for o in answer.outputs}
        assert _texts(got["decision"].as_numpy()) == expected["decision"], case
        assert got["confidence"].as_numpy().tolist() == pytest.approx(expected["confidence"], rel=1e-6), case
    assert [o.name for o in answers["json in, one binary out"].outputs] == ["decision", "confidence"]
    assert answers["binary out"].outputs[4].as_numpy().tolist() == expected["low_confidence"]


class GzipTransport(httpx.AsyncHTTPTransport):
    """KServe's SDK has no compression option; its RESTConfig takes an httpx transport: this one gzips bodies."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            packed = gzip.compress(await request.aread())
            request = httpx.Request("POST", request.url, content=packed, headers={
                **{k: v for k, v in request.headers.items() if k.lower() != "content-length"},
                "content-encoding": "gzip"})
        return await super().handle_async_request(request)


async def _kserve_gzip(url: str) -> kserve.InferResponse:
    config = kserve.RESTConfig(protocol="v2", transport=GzipTransport())
    async with kserve.InferenceRESTClient(config) as client:
        tensor = kserve.InferInput("input", [len(ROWS)], "BYTES")
        tensor.set_data_from_numpy(_docs())
        return await client.infer(url, kserve.InferRequest("credit", [tensor]), model_name="credit")


def test_kserve_sdk_gzip_bodies_are_decoded(proc, expected):
    answer = asyncio.run(_kserve_gzip(proc.url))
    assert _texts(answer.outputs[0].as_numpy()) == expected["decision"]


def test_a_utf16_body_is_400_over_the_socket(proc):
    body = json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                   "data": [json.dumps(ROWS[0])]}]}).encode("utf-16")
    r = httpx.post(f"{proc.url}/v2/models/credit/infer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "UTF-16" in r.json()["error"], r.text


async def _kserve_readiness(url: str) -> tuple[bool, bool, str]:
    async with kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2")) as client:
        asked = await client.is_server_ready(url, headers={"accept": "application/json"})
        model = await client.is_model_ready(url, "credit")
        try:
            await client.is_server_ready(url)
            raised = ""
        except httpx.HTTPStatusError as exc:
            raised = str(exc)
        return asked, model, raised


def test_unready_is_false_to_both_sdks_and_503_to_probes(proc):
    proc.misbehave("down")
    try:
        eventually(lambda: httpx.get(f"{proc.url}/v2/health/ready").status_code == 503, timeout=30,
                   what="readiness to follow the stopped upstream")
        client = triton.InferenceServerClient(f"127.0.0.1:{proc.port}")
        try:
            assert client.is_server_ready() is False and client.is_model_ready("credit") is False
        finally:
            client.close()
        asked, model, raised = asyncio.run(_kserve_readiness(proc.url))
        assert asked is False and model is False
        assert "503" in raised and "upstream" in raised  # without Accept: KServe's SDK raises, naming the reason
        probe = httpx.get(f"{proc.url}/v2/health/ready", headers={"user-agent": "kube-probe/1.31", "accept": "*/*"})
        assert probe.status_code == 503 and probe.json()["ready"] is False
    finally:
        proc.misbehave("healthy")
    eventually(lambda: httpx.get(f"{proc.url}/v2/health/ready").status_code == 200, timeout=30)
    asked, model, raised = asyncio.run(_kserve_readiness(proc.url))
    assert asked is True and model is True and raised == ""
