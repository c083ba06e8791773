"""extraArgs read as vLLM reads them: no spelling slips a managed or removed flag past the operator."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from arbiter_operator.api.models import DecisionModel
from arbiter_operator.api.vllm_flags import MANAGED_VLLM_FLAGS, REMOVED_VLLM_FLAGS, UNSAFE_VLLM_FLAGS
from arbiter_operator.plan import Observations, plan
from arbiter_operator.plan.vllm_args import arg_problems, flag_name
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import example
from test_planner import T0


@pytest.mark.parametrize(
    "args, flag",
    [
        (["-tp", "3"], "--tensor-parallel-size"),
        (["-tp=3"], "--tensor-parallel-size"),
        (["--tensor_parallel_size=3"], "--tensor-parallel-size"),
        (["--tensor-parallel", "3"], "--tensor-parallel-size"),  # argparse prefix matching
        (["-pp", "2"], "--pipeline-parallel-size"),
        (["--swap_space", "4"], "--swap-space"),
        (["--disable_log_requests"], "--disable-log-requests"),
        (["--guided_decoding_backend=xgrammar"], "--guided-decoding-backend"),
        (["--structured_outputs_config.backend=guidance"], "--structured-outputs-config"),
        (["--max_model_len", "9"], "--max-model-len"),
        (["--port=9000"], "--port"),
        (["--config", "/tmp/flags.yaml"], "--config"),
        (["-q", "fp8"], "--quantization"),
        (["--quantization", "fp8"], "--quantization"),
        (["--kv_cache_dtype=fp8"], "--kv-cache-dtype"),
        (["--speculative_config", '{"method": "ngram", "num_speculative_tokens": 3}'], "--speculative-config"),
        (["--speculative-config.method=ngram"], "--speculative-config"),
        (["--api_server_count=4"], "--api-server-count"),
        (["-asc", "4"], "--api-server-count"),
    ],
)
def test_spellings_vllm_accepts_are_refused(args: list[str], flag: str) -> None:
    problems = arg_problems(args)
    assert problems and all(flag in p for p in problems), problems


@pytest.mark.parametrize("args", [["--enable-prefix-caching"], ["--enable_prefix_caching"], ["-O3"],
                                  ["--kv-cache-memory-bytes", "9"], ["--quantization-config", "{}"],
                                  ["--max-num-batched-tokens", "-1"]])
def test_other_flags_pass(args: list[str]) -> None:
    assert arg_problems(args) == []


def _respell(flag: str, draw: st.DrawFn) -> str:
    name = flag[2:]
    name = "".join(draw(st.sampled_from([c, "_"])) if c == "-" else c for c in name)
    if draw(st.booleans()):
        name = name[: draw(st.integers(min_value=min(len(name), 4), max_value=len(name)))]
    form = draw(st.sampled_from(["{}", "{}=1", "{}.x=1"]))
    return "--" + form.format(name)


@st.composite
def smuggled(draw: st.DrawFn) -> tuple[str, str]:
    flag = draw(st.sampled_from(sorted({**MANAGED_VLLM_FLAGS, **REMOVED_VLLM_FLAGS, **UNSAFE_VLLM_FLAGS})))
    return flag, _respell(flag, draw)


@settings(max_examples=500, deadline=None)
@given(smuggled())
def test_no_respelling_of_a_checked_flag_passes(case: tuple[str, str]) -> None:
    flag, arg = case
    name = flag_name(arg)
    assert name is not None and flag.startswith(name)
    assert arg_problems([arg]), arg


def test_operator_reports_a_smuggled_flag_as_invalid_spec_and_touches_nothing() -> None:
    raw: dict[str, Any] = copy.deepcopy(example())
    raw["metadata"].update(namespace="team", uid="u1", generation=2)
    raw["spec"]["serving"]["vllm"]["extraArgs"] = ["--tensor-parallel", "3"]
    p = plan(DecisionModel.model_validate(raw), Observations(), T0)
    assert p.children is None  # nothing that serves is changed
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "--tensor-parallel-size" in ready["message"]


def test_api_servers_render_vllms_flag_and_one_renders_none() -> None:
    """One API server is vLLM's default: no flag, so the pods of a model that does not ask stay as they were."""
    from arbiter_operator.render.inferenceservice import vllm_args
    from test_quantization import dm_with

    plain = vllm_args(dm_with())
    assert not any(a.startswith("--api-server-count") for a in plain)
    assert vllm_args(dm_with(vllm={"apiServers": 1})) == plain
    four = vllm_args(dm_with(vllm={"apiServers": 4}))
    assert [a for a in four if a not in plain] == ["--api-server-count=4"]
    assert [a for a in four if a != "--api-server-count=4"] == plain


@pytest.mark.parametrize("value", [0, 17, 2.5])
def test_api_servers_out_of_range_are_refused(value: object) -> None:
    from pydantic import ValidationError
    from test_quantization import dm_with

    with pytest.raises(ValidationError, match="apiServers"):
        dm_with(vllm={"apiServers": value})


def test_engines_render_each_engines_memory_share_and_the_count_and_one_renders_nothing() -> None:
    """engines 2 on the default 0.9: each engine may use 0.45 of the GPU (the two never more than the spec allows),
    and the runtime is told how many to start; engines 1 leaves the arguments and the environment as they were."""
    from arbiter_operator.render import render_configmap, render_inferenceservice
    from arbiter_operator.render.inferenceservice import PredictorInputs, vllm_args
    from test_quantization import dm_with

    def pod(dm: DecisionModel) -> dict[str, Any]:
        version = dm.spec.versions[0]
        isvc = render_inferenceservice(PredictorInputs(dm, version, render_configmap(dm, version), {}))
        return isvc["spec"]["predictor"]["model"]

    plain, one = dm_with(), dm_with(vllm={"engines": 1})
    assert vllm_args(one) == vllm_args(plain) and pod(one)["env"] == pod(plain)["env"]
    assert not any(e["name"] == "ARBITER_VLLM_ENGINES" for e in pod(plain)["env"])
    two = dm_with(vllm={"engines": 2, "gpuMemoryUtilization": 0.9})
    assert [a for a in vllm_args(two) if a not in vllm_args(plain)] == ["--gpu-memory-utilization=0.45"]
    assert {"name": "ARBITER_VLLM_ENGINES", "value": "2"} in pod(two)["env"]
    three = vllm_args(dm_with(vllm={"engines": 3, "gpuMemoryUtilization": 0.95}))
    assert "--gpu-memory-utilization=0.316" in three  # rounded down: 3 x 0.316 <= 0.95


@settings(max_examples=200, deadline=None)
@given(utilization=st.floats(0.01, 1.0), engines=st.integers(1, 8))
def test_the_engines_shares_never_add_up_to_more_than_the_spec_allows(utilization: float, engines: int) -> None:
    from arbiter_operator.api.models import engine_memory_share

    share = engine_memory_share(utilization, engines)
    assert share * engines <= utilization + 1e-12 and (engines == 1 or share > utilization / engines - 0.001)
