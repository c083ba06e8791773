"""Reading Prometheus (or a Thanos querier) from the plugin: instant and range queries over HTTP, with the
kubeconfig's bearer token, answers bounded in size and checked in shape (a proxy or a wrong URL answers anything).

The operator's own client (clients/prometheus.py) runs on its event loop; the plugin's commands are synchronous, so
this is httpx's synchronous client with the same bounds. The PromQL for a model lives in queries.py.
"""

from __future__ import annotations

from typing import Any

import httpx

MAX_ANSWER_BYTES = 8 * 1024 * 1024


class PrometheusError(Exception):
    """A query that could not be answered: the message says by whom and why."""


class Prometheus:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout, headers=headers, follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        try:
            with self._http.stream("GET", f"{self.url}{path}", params=params) as resp:
                body = b""
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise PrometheusError(f"Prometheus at {self.url} answered more than {MAX_ANSWER_BYTES} bytes")
                status = resp.status_code
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {type(exc).__name__}: {exc}") from None
        try:
            doc = httpx.Response(200, content=body).json()
        except ValueError:
            doc = None
        if status in (401, 403):
            raise PrometheusError(f"Prometheus at {self.url} answered {status}: the kubeconfig's token may not read "
                                  "metrics (on OpenShift: cluster-monitoring-view, or the namespace's monitoring view)")
        if status // 100 != 2 or not isinstance(doc, dict) or doc.get("status") != "success" \
                or not isinstance(doc.get("data"), dict):
            detail = doc.get("error") if isinstance(doc, dict) else body[:120].decode("utf-8", "replace")
            raise PrometheusError(f"Prometheus at {self.url} answered {status}: {detail}")
        return doc["data"]

    def vector(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series; NaN and unparseable values left out."""
        data = self._get("/api/v1/query", {"query": promql})
        out: list[tuple[dict[str, str], float]] = []
        for item in _series(data, "vector"):
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if value == value:  # not NaN (an empty histogram's quantile)
                out.append((_labels(item), value))
        return out

    def scalar(self, promql: str) -> float | None:
        found = self.vector(promql)
        return found[0][1] if found else None

    def matrix(self, promql: str, start: float, end: float, step: float) -> list[tuple[dict[str, str],
                                                                                       list[tuple[float, float]]]]:
        """A range query: (labels, [(time, value)]) per series."""
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{step:g}"})
        out = []
        for item in _series(data, "matrix"):
            points = []
            values = item.get("values")
            for pair in values if isinstance(values, list) else []:
                try:
                    t, v = float(pair[0]), float(pair[1])
                except (KeyError, IndexError, TypeError, ValueError):
                    continue
                if v == v:
                    points.append((t, v))
            out.append((_labels(item), points))
        return out


def _series(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The answer's series when it is of `kind`; anything that is not a series object is left out."""
    result = data.get("result") if data.get("resultType") == kind else None
    return [item for item in result if isinstance(item, dict)] if isinstance(result, list) else []


def _labels(item: dict[str, Any]) -> dict[str, str]:
    metric = item.get("metric")
    return {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}
