"""The dashboard's pages at fleet size: the overview of N models and one model's page (a canary rolled back, with its
timeline, gates and Prometheus numbers), as `kubectl arbiter dashboard` renders them from its store. Prints the
server's render time (median and max of the repetitions), the page's bytes, and, where Debian's Chromium is
installed, the browser's load time of the overview (navigation start to the load event, from a file: no network).

    .venv/bin/python benchmarks/dashboard_page.py [--count 200] [--repetitions 20]

The end-to-end figure (the real server, its watch of the real apiserver, Chromium over HTTP) is
tests/cluster/cli/test_plugin_live.py::test_the_overview_of_200_models_loads_in_under_a_second.
"""

from __future__ import annotations

import copy
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import common
from arbiter_operator.cli.dashboard.render import CSS, model_page, overview
from arbiter_operator.cli.dashboard.store import ModelMetrics, Store
from support.plannerdrive import candidate_ready

CHROMIUM = "/usr/bin/chromium"


def store_of(count: int) -> tuple[Store, tuple[str, str]]:
    """`count` models; every tenth one's canary rolled back, the rest idle; the first with Prometheus numbers."""
    d = candidate_ready(strategy="Canary", steps=[{"weight": 10, "holdSeconds": 60}, {"weight": 50, "holdSeconds": 60}],
                        analysis={"intervalSeconds": 30, "minRequests": 50})
    idle = copy.deepcopy(d.body)
    snaps = [copy.deepcopy(d.body)]
    for p95 in (0.05, 0.4):
        d.now += timedelta(seconds=60)
        snaps.append(copy.deepcopy(d.reconcile(0, d.analysis(p95, 0, 500))))
    snaps.append(copy.deepcopy(d.reconcile(1)))
    store, t0 = Store(), time.time() - 600
    for i in range(count):
        for j, body in enumerate(snaps if i % 10 == 0 else [idle]):
            body = copy.deepcopy(body)
            body["metadata"]["name"] = f"model-{i:04d}"
            store.put(body, t0 + 60 * j)
    key = ("team", "model-0000")
    store.set_metrics(key, ModelMetrics(at=time.time(), mix={v: {"approved": 0.5, "rejected": 0.3, "review": 0.2}
                                                             for v in ("1.0.0", "1.1.0")},
                                        fallbacks={"1.1.0": {"upstream_error": 0.3}},
                                        latency={"1.0.0": (0.04, 0.12), "1.1.0": (0.05, 0.4)},
                                        rate={"1.0.0": 9.0, "1.1.0": 1.0}))
    return store, key


def timed(fn, repetitions: int) -> tuple[list[float], str]:
    times, out = [], ""
    for _ in range(repetitions):
        started = time.perf_counter()
        out = fn()
        times.append(1000 * (time.perf_counter() - started))
    return times, out


def browser_load_ms(html: str) -> float | None:
    if not shutil.which(CHROMIUM):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    work = Path(tempfile.mkdtemp())
    (work / "app.css").write_text(CSS)
    (work / "page.html").write_text(html.replace('href="/app.css"', 'href="app.css"').replace(
        '<script src="/app.js" defer></script>', ""))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        loads = []
        for _ in range(5):
            driver.get((work / "page.html").as_uri())
            loads.append(driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"))
        return statistics.median(loads)
    finally:
        driver.quit()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--repetitions", type=int, default=20)
    args = p.parse_args()
    store, key = store_of(args.count)
    over_ms, over = timed(lambda: overview(store.snapshot(), time.time()), args.repetitions)
    page_ms, page = timed(lambda: model_page(key, store.snapshot(key), time.time(), True), args.repetitions)
    load = browser_load_ms(over)
    rows = [("overview", args.count, f"{statistics.median(over_ms):.2f} / {max(over_ms):.2f}", len(over.encode()),
             "n/a" if load is None else f"{load:.0f}"),
            ("model page", 1, f"{statistics.median(page_ms):.2f} / {max(page_ms):.2f}", len(page.encode()), "-")]
    print(common.table(["page", "models", "render ms (median / max)", "bytes", "Chromium load ms"], rows))
    common.write_json({"machine": common.machine(), "count": args.count, "overview_ms": over_ms,
                       "model_page_ms": page_ms, "overview_bytes": len(over.encode()),
                       "model_page_bytes": len(page.encode()), "chromium_load_ms": load},
                      args.out, "dashboard_page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
