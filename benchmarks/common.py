"""Shared helpers of the operator benchmarks (convergence.py, scale.py, idle.py, ...): tables, percentiles, the
machine, JSON results, process CPU and memory, and the apiserver request counts. The fleet they drive is fleet.py.

Request counts come from two places: the apiserver's `apiserver_request_total` (from /metrics, every client together)
and the audit log (per user). The operator's figures are the audit log's, filtered by its ServiceAccount; the
metrics totals are printed next to them as a cross-check (metrics total = operator + KServe + cluster components +
driver).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLE = ROOT / "examples" / "decisionmodel.yaml"

from arbiter_devenv.cluster import USERS  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

GROUP, VERSION, PLURAL = "arbiter.dev", "v1alpha1", "decisionmodels"
SYSTEM_NS = "arbiter-bench-system"
OPERATOR_SA = "arbiter-operator"
SHARD_LABEL = "arbiter.dev/shard"  # with --shards: the label whose value names the operator that owns a namespace
OPERATOR_USER = f"system:serviceaccount:{SYSTEM_NS}:{OPERATOR_SA}"
KSERVE_USER = USERS["kserve"]

# Every request at Metadata level, written once when it completes (watches: when the stream ends). Batch mode keeps
# the audit writes off the request path; the driver waits out one flush interval before it reads the log.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata"}],
}
AUDIT_FLUSH_S = 1.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- statistics and output --------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: with 50 samples p99 is the largest, as it should be)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
        "min": min(values) if values else float("nan"),
        "max": max(values) if values else float("nan"),
    }


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A Markdown table (pastes straight into docs/benchmarks.md)."""
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    mem_kb = 0
    with contextlib.suppress(OSError, StopIteration):
        mem_kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def write_json(result: dict[str, Any], out: str | None, default_name: str) -> pathlib.Path:
    path = pathlib.Path(out) if out else RESULTS / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    result.setdefault("machine", machine())
    result["machine"]["loadavg_end"] = os.getloadavg()
    path.write_text(json.dumps(result, indent=2, default=str))
    log(f"results written to {path}")
    return path


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", help="JSON result path (default: benchmarks/results/<name>.json)")
    p.add_argument("--operator-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the operator process (e.g. ARBITER_RESYNC_SECONDS=60)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (audit log, operator log)")
    return p


def add_watch_arg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--watch", choices=("all", "listed"), default="all",
                   help="all: the operator watches cluster-wide, one watch per kind (the chart's default install, "
                        "watchedNamespaces: []); listed: it is given the namespaces, one watch per kind and namespace "
                        "(the chart's per-namespace Roles mode)")
    return p


# -- the operator process's cost, from /proc --------------------------------------------------------------------------


class ProcStats:
    """CPU seconds and RSS of one process; the kernel's own high-water mark (VmHWM) gives the peak RSS."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int):
        self.pid = pid

    def cpu_seconds(self) -> float:
        fields = pathlib.Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.TICK  # utime + stime

    def system_cpu_seconds(self) -> float:
        """The kernel's share of cpu_seconds (stime: socket reads and writes, polling, thread wake-ups)."""
        fields = pathlib.Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[12]) / self.TICK

    def _status(self, key: str) -> int:
        for line in pathlib.Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def rss(self) -> int:
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        return self._status("VmHWM")


class GroupStats:
    """ProcStats over several operator processes (shards): CPU seconds add up; RSS is the largest process's, since
    each shard is its own pod with its own memory limit."""

    def __init__(self, pids: list[int]):
        self.parts = [ProcStats(pid) for pid in pids]
        self.pid = pids[0]

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.parts)

    def system_cpu_seconds(self) -> float:
        return sum(p.system_cpu_seconds() for p in self.parts)

    def rss(self) -> int:
        return max(p.rss() for p in self.parts)

    def peak_rss(self) -> int:
        return max(p.peak_rss() for p in self.parts)


# -- request accounting -----------------------------------------------------------------------------------------------


def metrics_requests(api: k8s.ApiClient) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource]) over every client."""
    resp = api.call_api("GET", api.configuration.host + "/metrics", header_params={"Accept": "text/plain"},
                        _request_timeout=30)
    text = resp.read().decode()
    out: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_s, value = line[len("apiserver_request_total{"):].rsplit("} ", 1)
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels_s))
        resource = labels.get("resource", "")
        if not resource:
            continue  # non-resource URLs (/metrics, /healthz, discovery)
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        out[(labels.get("verb", ""), resource)] += int(float(value))
    return out


def operator_counters(op: Any) -> dict[str, float]:
    """The operator's own counters from its /metrics page: reconcile passes (all results), watch echoes skipped, and
    its API requests by verb (e.g. "requests_GET"). Counters only grow: diff two readings."""
    out: dict[str, float] = {}
    for line in op.scrape().splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("arbiter_operator_reconcile_total{"):
            out["reconciles"] = out.get("reconciles", 0.0) + float(value)
        elif name.startswith("arbiter_operator_watch_echoes_skipped_total"):
            out["echoes_skipped"] = out.get("echoes_skipped", 0.0) + float(value)
        elif name.startswith(("arbiter_operator_watch_events_total{", "arbiter_operator_watch_bytes_total{")):
            kind = re.search(r'kind="(\w+)"', name)
            key = f"{'watch_events' if 'events' in name else 'watch_bytes'}_{kind.group(1) if kind else '?'}"
            out[key] = out.get(key, 0.0) + float(value)
        elif name.startswith("arbiter_operator_kube_requests_total{"):
            verb = re.search(r'verb="(\w+)"', name)
            key = f"requests_{verb.group(1) if verb else '?'}"
            out[key] = out.get(key, 0.0) + float(value)
    return out


def audit_requests(audit_log: pathlib.Path, user: str | None, since: float, until: float | None = None
                   ) -> Counter[tuple[str, str]]:
    """Completed requests of `user` (None: everyone) received in [since, until), by (verb, resource[/sub])."""
    out: Counter[tuple[str, str]] = Counter()
    with open(audit_log) as fh:
        for line in fh:
            ev = json.loads(line)
            if ev.get("stage") != "ResponseComplete":
                continue
            if user is not None and ev["user"].get("username") != user:
                continue
            ts = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if ts < since or (until is not None and ts >= until):
                continue
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource", "")
            if not resource:
                continue
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            out[(ev["verb"], resource)] += 1
    return out


def counter_rows(c: Counter[tuple[str, str]], per: float = 1.0) -> list[tuple[str, str, int, float]]:
    return [(verb, res, n, n / per) for (verb, res), n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]


def counter_json(c: Counter[tuple[str, str]]) -> dict[str, int]:
    return {f"{verb} {res}": n for (verb, res), n in sorted(c.items())}


# -- DecisionModels ---------------------------------------------------------------------------------------------------


def parse_env(pairs: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)
