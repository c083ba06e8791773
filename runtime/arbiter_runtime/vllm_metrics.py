"""vLLM's own metrics, re-exported on the decision server's port at /metrics/vllm.

vLLM listens on 127.0.0.1 inside the pod (the supervisor binds it there: nothing outside the pod may send it
prompts), so Prometheus cannot scrape it. The PodMonitor's second endpoint scrapes this path instead; the series
keep their `vllm:` names and labels and get the pod's `arbiter.dev/decision-model` and `arbiter.dev/version` labels
from the PodMonitor, like the runtime's own, so the promotion analysis and SREs read KV-cache use
(`vllm:kv_cache_usage_perc`), queue time (`vllm:request_queue_time_seconds`), time to first token and end-to-end
latency per version. Only `vllm:` families pass: vLLM's process and Python collectors would clash with nothing here,
but they say nothing about serving and double the scrape.

`model_name` is the InferenceService's name (the pod's ARBITER_AUTH_INFERENCESERVICE, set for every version) rather
than vLLM's served model name, which is the DecisionModel's model for every version: OpenShift AI's metrics page for a
deployment (odh-model-controller's vLLM queries) selects `model_name` = the InferenceService, and one version's series
stay apart from another's in any query that ignores the pod labels.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import aiohttp
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from .upstream import AnswerTooLarge, read_capped

MAX_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 3.0
PREFIX = "vllm:"


def _label(name: str) -> re.Pattern[str]:
    """A `name="..."` label in a sample's label set; its value is a quoted string with backslash escapes."""
    return re.compile(r'([{,]\s*' + name + r'\s*=\s*)"(?:[^"\\]|\\.)*"')


_MODEL_NAME = _label("model_name")
_ENGINE = _label("engine")


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def only_vllm(text: str, model_name: str = "") -> str:
    """The lines of a Prometheus text exposition that belong to `vllm:` families (samples, HELP and TYPE); with
    `model_name`, each sample's `model_name` label says it instead of vLLM's served model name."""
    out = []
    label = f'"{_escaped(model_name)}"'
    # Lines end at "\n" alone, as Prometheus reads them (a label value may hold a raw "\r", which splitlines cuts).
    for line in text.split("\n"):
        if line.startswith(PREFIX):
            out.append(_MODEL_NAME.sub(lambda m: m.group(1) + label, line) if model_name else line)
        elif line.startswith(("# HELP ", "# TYPE ")) and line[7:].startswith(PREFIX):
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


async def scrape(upstream_root: str, model_name: str = "") -> tuple[int, str]:
    """(200, filtered text) or (503, why)."""
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            async with session.get(upstream_root + "/metrics") as resp:
                if resp.status != 200:
                    return 503, f"vLLM's /metrics answered {resp.status}\n"
                body = await read_capped(resp, MAX_BYTES)
    except AnswerTooLarge:
        return 503, f"vLLM's /metrics is larger than {MAX_BYTES} bytes\n"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return 503, f"vLLM's /metrics is unreachable ({type(exc).__name__})\n"
    return 200, only_vllm(body.decode("utf-8", errors="replace"), model_name)


def with_engine(line: str, engine: int) -> str:
    """A sample line whose `engine` label says the pod's engine number: vLLM's own `engine` label (its data-parallel
    rank, "0" for every engine here, each being a server of its own) gets the number; a sample without one gets the
    label first in its set."""
    name, brace, rest = line.partition("{")
    if brace:
        relabelled, found = _ENGINE.subn(lambda m: f'{m.group(1)}"{engine}"', "{" + rest, count=1)
        if found:
            return name + relabelled
        return f'{name}{{engine="{engine}",{rest}' if not rest.lstrip().startswith("}") else \
            f'{name}{{engine="{engine}"{rest.lstrip()}'
    name, space, value = line.partition(" ")
    return f'{name}{{engine="{engine}"}}{space}{value}'


def merge_engines(pages: list[str]) -> str:
    """The filtered pages of several engines as one exposition: each family's HELP and TYPE once, then its samples
    from every engine, each with an `engine` label (the engine's number), so the series of two engines on one pod
    stay apart. A family is the block from its `# HELP` line to the next, as vLLM's prometheus_client writes it."""
    families: dict[str, list[str]] = {}  # a family's name -> its header lines, then every engine's samples
    for engine, page in enumerate(pages):
        known = set(families)  # the families whose HELP and TYPE an engine before this one gave
        family = ""
        for line in page.split("\n"):
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line[7:].split(" ", 1)[0]
                if family not in known:
                    families.setdefault(family, []).append(line)
            elif line:
                families.setdefault(family, []).append(with_engine(line, engine))
    out = [line for lines in families.values() for line in lines]
    return "\n".join(out) + ("\n" if out else "")


async def scrape_all(roots: tuple[str, ...], model_name: str = "") -> tuple[int, str]:
    """One engine's page as it is; several engines' merged (merge_engines), or 503 naming the engine that failed."""
    if len(roots) == 1:
        return await scrape(roots[0], model_name)
    pages = await asyncio.gather(*(scrape(root, model_name) for root in roots))
    for engine, (status, text) in enumerate(pages):
        if status != 200:
            return status, f"engine {engine}: {text}"
    return 200, merge_engines([text for _, text in pages])


def endpoint(upstream_roots: tuple[str, ...], model_name: str = "") -> Callable[[Request], Awaitable[Response]]:
    """upstream_roots: the pod's vLLM engines; model_name: the InferenceService's name, put in each series'
    `model_name` label (empty: vLLM's own)."""

    async def vllm_metrics(_: Request) -> Response:
        status, text = await scrape_all(upstream_roots, model_name)
        return PlainTextResponse(text, status_code=status, media_type="text/plain; version=0.0.4; charset=utf-8")

    return vllm_metrics
