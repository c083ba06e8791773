"""Bad DecisionModel specs the CRD itself rejects, each with words of the apiserver's message: what
tests/cluster/operator/test_operator_bad_input.py applies to the real apiserver, and what `kubectl arbiter lint` must
refuse with the same message (tests/cluster/cli/test_plugin_lint.py, tests/unit/operator/cli/test_lint.py).
Each case is (edit of the example manifest, words of the message)."""

from __future__ import annotations

import copy


def set_field(path: str, value):
    """An edit that sets (or, with DELETE, removes) the field at a dotted path (digits index lists)."""
    def edit(body):
        node = body
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node.setdefault(k, {})
        last = keys[-1]
        if value is DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
        return body
    return edit


DELETE = object()


def _second_version(name):
    def edit(body):
        v2 = copy.deepcopy(body["spec"]["versions"][0])
        v2["name"] = name
        body["spec"]["versions"].append(v2)
        return body
    return edit


CASES = {
    "promote-unknown-version": (set_field("spec.promote.version", "9.9.9"),
                                "spec.promote.version must name one of spec.versions[].name"),
    "gpus-3": (set_field("spec.serving.gpus", 3),
               "spec.serving.gpus is the tensor parallel size and must be 1, 2, 4 or 8"),
    "swap-space": (set_field("spec.serving.vllm.extraArgs", ["--swap-space=4"]),
                   "--swap-space was removed in vLLM 0.26"),
    "speculative-config": (set_field("spec.serving.vllm.extraArgs",
                                     ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']),
                           "--speculative-config (speculative decoding) breaks decisions in vLLM 0.26"),
    "api-server-count-in-extra-args": (set_field("spec.serving.vllm.extraArgs", ["--api-server-count=4"]),
                                       "--api-server-count is set by the operator from spec.serving.vllm.apiServers"),
    "api-servers-0": (set_field("spec.serving.vllm.apiServers", 0), "apiServers"),
    "api-servers-17": (set_field("spec.serving.vllm.apiServers", 17), "apiServers"),
    "api-servers-string": (set_field("spec.serving.vllm.apiServers", "4"), "apiServers"),
    "engines-9": (set_field("spec.serving.vllm.engines", 9), "engines"),
    "engines-with-tensor-parallel": (lambda b: set_field("spec.serving.gpus", 2)(
        set_field("spec.serving.vllm.engines", 2)(b)), "spec.serving.vllm.engines above 1 shares one GPU"),
    "engines-with-nodes": (lambda b: set_field("spec.serving.nodes", 2)(
        set_field("spec.serving.vllm.engines", 3)(b)), "it needs gpus 1 and nodes 1"),
    "disable-log-requests": (set_field("spec.serving.vllm.extraArgs", ["--disable-log-requests"]),
                             "--enable-log-requests turns logging on"),
    "guided-decoding-backend": (set_field("spec.serving.vllm.extraArgs", ["--guided-decoding-backend", "xgrammar"]),
                                "set spec.serving.vllm.structuredOutputsBackend"),
    "tp-in-extra-args": (set_field("spec.serving.vllm.extraArgs", ["--tensor-parallel-size=2"]),
                         "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "duplicate-version": (_second_version("1.0.0"), "Duplicate value"),
    "colliding-version-slug": (_second_version("1-0-0"), "spec.versions[].name must be unique"),
    "storage-uri-scheme": (set_field("spec.versions.0.storageUri", "https://example.com/model"),
                           "storageUri must start with s3://, pvc:// or oci://"),
    "missing-bias-report": (set_field("spec.versions.0.metadata.biasReportUrl", DELETE),
                            "spec.versions[0].metadata.biasReportUrl: Required value"),
    "training-data-backwards": (set_field("spec.versions.0.metadata.trainingData.to", "2023-01-01"),
                                "trainingData.to must not be before trainingData.from"),
    "canary-weights-decreasing": (set_field("spec.promote.steps", [{"weight": 50}, {"weight": 10}]),
                                  "spec.promote.steps[].weight must be strictly increasing"),
    "canary-without-steps": (lambda b: set_field("spec.promote.steps", [])(
                                 set_field("spec.promote.strategy", "Canary")(b)),
                             "spec.promote.strategy Canary needs at least one entry"),
    "fallback-decision-unknown": (set_field("spec.decision.fallbackRules.0.decision", "maybe"),
                                  "every decision.fallbackRules[].decision must be one of decision.labels"),
    "fallback-policy-without-rules": (set_field("spec.decision.fallbackRules", []),
                                      "decision.lowConfidencePolicy 'fallback' needs at least one entry"),
    "registry-ref-and-url": (set_field("spec.registry", {"url": "https://registry.example.com",
                                                    "modelRegistryRef": {"name": "modelregistry-public"}}),
                             "spec.registry needs exactly one of modelRegistryRef or url"),
    "tls-passthrough": (set_field("spec.exposure.tls", "passthrough"), 'Unsupported value: "passthrough"'),
    "mesh-unknown": (set_field("spec.mesh.sidecar", "off"), 'Unsupported value: "off"'),
    "memory-utilization-above-1": (set_field("spec.serving.vllm.gpuMemoryUtilization", 1.5),
                                   "spec.serving.vllm.gpuMemoryUtilization: Invalid value: 1.5: spec.serving.vllm."
                                   "gpuMemoryUtilization in body should be less than or equal to 1"),
    "multi-node-replicas": (lambda b: set_field("spec.serving.replicas", 2)(set_field("spec.serving.nodes", 2)(b)),
                            "spec.serving.replicas must be 1 when spec.serving.nodes > 1"),
    "name-too-long": (set_field("metadata.name", "a" * 50), "metadata.name plus each version name must be at most 46"),
    # 42 + len("1.0.0") = 47: the InferenceService would be 49 characters and KServe's label isvc.<isvc>-predictor 64.
    "name-one-too-long-for-kserves-label": (set_field("metadata.name", "a" * 42),
                                             "app=isvc.<InferenceService>-predictor, a label value of at most 63"),
    "name-too-long-multi-node": (
        lambda b: set_field("spec.serving.nodes", 2)(set_field("metadata.name", "a" * 35)(b)),
        "with spec.serving.nodes > 1, metadata.name plus each version name must be at most 39",
    ),
    "name-with-dot": (set_field("metadata.name", "credit.limit"), "KServe requires [a-z]([-a-z0-9]*[a-z0-9])?"),
    "name-leading-digit": (set_field("metadata.name", "1credit"), "metadata.name must start with a letter"),
    "name-with-separator": (set_field("metadata.name", "credit--limit"), "metadata.name must not contain '--'"),
    "tp-short-alias": (set_field("spec.serving.vllm.extraArgs", ["-tp", "3"]),
                       "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "tp-underscores": (set_field("spec.serving.vllm.extraArgs", ["--tensor_parallel_size=3"]),
                       "--tensor-parallel-size is set by the operator from spec.serving.gpus"),
    "swap-space-underscore": (set_field("spec.serving.vllm.extraArgs", ["--swap_space", "4"]),
                              "--swap-space was removed in vLLM 0.26"),
    "disable-log-requests-underscore": (set_field("spec.serving.vllm.extraArgs", ["--disable_log_requests"]),
                                        "--disable-log-requests was removed in vLLM 0.26"),
    "structured-outputs-dotted": (set_field("spec.serving.vllm.extraArgs", ["--structured_outputs_config.backend=x"]),
                                  "--structured-outputs-config is set by the operator"),
    "one-label": (set_field("spec.decision.labels", ["approved"]), "spec.decision.labels: Invalid value"),
    "sequential-settings-without-the-mode": (set_field("spec.promote.analysis", {"sequential": {"lookSeconds": 2}}),
                                             "spec.promote.analysis.sequential is read only with analysis.mode"),
    "sequential-with-failure-limit": (set_field("spec.promote.analysis", {"mode": "Sequential", "failureLimit": 2}),
                                      "spec.promote.analysis.failureLimit must be 0 with analysis.mode: Sequential"),
}
