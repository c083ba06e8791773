"""`kubectl arbiter lint` without a cluster: the shipped examples pass, every bad spec the CRD rejects is refused
with the apiserver's words (the cluster test compares whole messages with the real apiserver's), the operator's own
checks follow, and no input, however malformed, ends in a traceback."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from arbiter_operator.cli import kubectl_arbiter as plugin
from arbiter_operator.cli.crdcheck import FieldError, go_value, validate
from arbiter_operator.cli.lint import lint_one
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bad_specs import CASES
from support.examples import EXAMPLES, example


def lint(*args: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str]:
    out = io.StringIO()
    code = plugin.main(["lint", *args], out=out)
    return code, out.getvalue()


def test_the_shipped_examples_pass():
    code, text = lint(*sorted(str(p) for p in EXAMPLES.glob("*.yaml")), "-n", "team")
    assert code == 0, text
    assert text.count(": ok") == len(list(EXAMPLES.glob("*.yaml")))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_bad_spec_the_crd_rejects_is_refused_with_its_words(case):
    edit, words = CASES[case]
    found = lint_one(edit(example()), "x.yaml", "team")
    assert not found.ok
    assert any(words in line for line in found.apiserver), found.apiserver


def test_a_file_with_problems_exits_11_naming_file_document_and_field(tmp_path):
    bad = example()
    bad["spec"]["serving"]["gpus"] = 3
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
                                        example(), bad]))
    code, text = lint(str(path))
    assert code == plugin.EXIT_PROBLEMS
    assert f"{path}#2: DecisionModel credit-limit: ok" in text  # the ConfigMap (#1) is not a DecisionModel: skipped
    assert (f"{path}#3: DecisionModel credit-limit: the apiserver refuses it: spec.serving.gpus: Invalid value: "
            '"integer": spec.serving.gpus is the tensor parallel size') in text


def test_unknown_fields_are_refused_as_kubectl_s_strict_validation_does():
    body = example()
    body["spec"]["servng"] = {"gpus": 2}
    body["spec"]["versions"][0]["storageURI"] = "s3://x/y"
    found = lint_one(body, "x", "team")
    assert 'unknown field "spec.servng"' in found.apiserver
    assert 'unknown field "spec.versions[0].storageURI"' in found.apiserver


def test_the_operator_s_checks_run_when_the_apiserver_would_admit():
    body = example()
    body["spec"]["decision"]["fallbackRules"][0]["when"] = "input.requestedLimit >"  # not CEL
    body["spec"]["serving"]["vllm"]["extraArgs"] = ["--tensor-parallel", "2"]  # vLLM reads it as -size
    found = lint_one(body, "x", "team")
    assert not found.apiserver
    text = " ".join(found.operator)
    assert "`when` is not valid CEL" in text and "--tensor-parallel" in text


def test_host_limits_depend_on_the_namespace():
    body = example()
    body["metadata"]["name"] = "a" * 40
    assert lint_one(body, "x", "ns").ok
    found = lint_one(body, "x", "a-rather-long-namespace-name")
    assert any("KServe names its predictor's host" in p for p in found.operator)


def test_model_config_checks_tensor_parallel_and_max_model_len(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 6,
                                  "num_key_value_heads": 2, "max_position_embeddings": 2048}))
    manifest = tmp_path / "dm.yaml"
    body = example()
    body["spec"]["serving"]["gpus"] = 4
    manifest.write_text(yaml.safe_dump(body))
    code, text = lint(str(manifest), "--model-config", str(config), "-n", "team")
    assert code == plugin.EXIT_PROBLEMS
    assert "TensorParallelMismatch: tensor parallel 4 does not divide 6 attention heads" in text


def test_unreadable_input_is_a_usage_error_naming_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: arbiter.dev/v1alpha1\nkind: DecisionModel\nspec: [unclosed\n")
    code, _ = lint(str(path))
    assert code == plugin.EXIT_USAGE
    code, _ = lint(str(tmp_path / "missing.yaml"))
    assert code == plugin.EXIT_USAGE


def test_json_output_lists_each_document():
    code, text = lint(str(EXAMPLES / "decisionmodel.yaml"), "-o", "json")
    assert code == 0 and json.loads(text)[0]["name"] == "credit-limit"


@pytest.mark.parametrize(("value", "printed"), [(1.5, "1.5"), (1.0, "1"), (3, "3"), (True, "true"),
                                                ("a\"b", '"a\\"b"'), ({"name": "1.0.0"}, '{"name":"1.0.0"}'),
                                                (["approved"], '["approved"]'), (None, "null")])
def test_values_print_as_the_apiserver_prints_them(value, printed):
    assert go_value(value) == printed


def test_field_errors_read_like_the_apiserver_s():
    assert str(FieldError("spec.x", "Required value")) == "spec.x: Required value"
    assert str(FieldError("spec.tls", "Unsupported value", 'supported values: "edge"', "p")) == \
        'spec.tls: Unsupported value: "p": supported values: "edge"'
    assert str(FieldError("spec.v", "Too long", "may not be more than 40 bytes")) == \
        "spec.v: Too long: may not be more than 40 bytes"
    # A wrong type names the type found, not the value: the apiserver's words for `apiServers: "4"`.
    assert [str(e) for e in validate("4", {"type": "integer"}, ".spec.n")] == \
        ['spec.n: Invalid value: "string": spec.n in body must be of type integer: "string"']


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                           st.text(max_size=6), lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=15)


@settings(max_examples=150, deadline=None)
@given(spec=json_values, serving=json_values, versions=json_values)
def test_any_document_gets_a_verdict_never_a_traceback(spec, serving, versions):
    body = example()
    body["spec"]["serving"] = serving
    body["spec"]["versions"] = versions
    if isinstance(spec, dict):
        body["spec"].update(spec)
    found = lint_one(body, "x", "team")
    assert isinstance(found.ok, bool)
    assert all(isinstance(p, str) and p for p in found.apiserver + found.operator)
