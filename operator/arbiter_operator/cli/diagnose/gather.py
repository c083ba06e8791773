"""Gathering diagnose's evidence, thinly: each read is one call, made with the user's own credentials, and a read that
fails (forbidden, unreachable) becomes a line of `Evidence.unreadable` instead of an error: a user with a read-only
Role on DecisionModels still gets a verdict, and is told what it did not see.

Where a version's numbers come from, in order: Prometheus (`--prometheus`, `$ARBITER_PROMETHEUS_URL`: rates over
`--window`, what an SRE on OpenShift has through the Thanos querier), and decision servers the user can reach
(`--metrics-url`, e.g. after `oc port-forward`: /metrics and /metrics/vllm, counts since the process started). Both
are sent the kubeconfig's bearer token, which the runtime's metrics endpoint and OpenShift's monitoring accept from a
user allowed to read metrics.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..cluster import CliError, Cluster
from ..promclient import Prometheus, PrometheusError
from ..queries import version_metrics
from .evidence import Evidence, from_pages, versions_on_page

MAX_PAGE_BYTES = 8 * 1024 * 1024


def live_versions(dm: dict[str, Any]) -> list[str]:
    """The versions worth asking about: stable, candidate, the one that failed last, the active one."""
    status = dm.get("status") or {}
    promo = status.get("promotion") or {}
    found = [promo.get("stable"), promo.get("candidate"), promo.get("failedVersion"), status.get("activeVersion")]
    return list(dict.fromkeys(str(v) for v in found if v))


def _page(http: httpx.Client, url: str) -> str:
    with http.stream("GET", url) as resp:
        body = b""
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > MAX_PAGE_BYTES:
                raise CliError(f"{url} answered more than {MAX_PAGE_BYTES} bytes")
        if resp.status_code != 200:
            raise CliError(f"{url} answered {resp.status_code}: {body[:200].decode('utf-8', 'replace').strip()}")
    return body.decode("utf-8", "replace")


def read_servers(ev: Evidence, urls: list[str], token: str | None, timeout: float) -> None:
    """Each decision server's own pages: the version it serves is on its page."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as http:
        for url in urls:
            base = url.rstrip("/")
            try:
                runtime = _page(http, f"{base}/metrics")
            except (httpx.HTTPError, CliError) as exc:
                ev.unreadable.append(f"decision server {base}/metrics: {exc}")
                continue
            try:
                vllm: str | None = _page(http, f"{base}/metrics/vllm")
            except (httpx.HTTPError, CliError) as exc:
                vllm = None
                ev.unreadable.append(f"vLLM's metrics through {base}/metrics/vllm: {exc}")
            for version in versions_on_page(runtime) or ["?"]:
                ev.metrics[version] = from_pages(version, f"{base}, since it started", runtime, vllm)
            ev.read.append(f"{base}/metrics" + (" and /metrics/vllm" if vllm is not None else ""))


def read_prometheus(ev: Evidence, url: str, token: str | None, versions: list[str], window_s: float,
                    timeout: float) -> None:
    prom = Prometheus(url, token, timeout)
    try:
        for version in versions:
            if version not in ev.metrics:
                ev.metrics[version] = version_metrics(prom, ev.namespace, ev.name, version, window_s)
        ev.read.append(f"Prometheus {url}")
    except PrometheusError as exc:
        ev.unreadable.append(f"the models' metrics from Prometheus: {exc}")
    finally:
        prom.close()


def gather(cluster: Cluster, name: str, metrics_urls: list[str], prometheus: str | None,
           window_s: float, metrics_token: str | None = None) -> Evidence:
    ev = Evidence(cluster.namespace, name)
    ev.dm = cluster.get(name)  # without the object there is nothing to diagnose: its errors are the command's
    ev.read.append(f"decisionmodel {cluster.namespace}/{name}")
    try:
        ev.events = cluster.events(cluster.namespace, [name])
        ev.read.append("Events")
    except CliError as exc:
        ev.unreadable.append(f"Events: {exc}")
    try:
        ev.pods = cluster.pods(cluster.namespace, f"arbiter.dev/decision-model={name}")
        ev.read.append("predictor pods")
    except CliError as exc:
        ev.unreadable.append(f"predictor pods: {exc}")
    timeout = cluster.timeout or 10.0
    token = metrics_token or cluster.bearer_token()
    if metrics_urls:
        read_servers(ev, metrics_urls, token, timeout)
    if prometheus:
        read_prometheus(ev, prometheus, token, live_versions(ev.dm), window_s, timeout)
    if not metrics_urls and not prometheus:
        ev.unreadable.append("the model's own metrics (fallbacks, schema violations, vLLM's queue and KV cache): "
                             "pass --prometheus URL (or set ARBITER_PROMETHEUS_URL; on OpenShift the "
                             "thanos-querier Route) or --metrics-url after `oc port-forward POD 8080`")
    return ev
