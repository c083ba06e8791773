"""The plugin against a promotion the real operator runs (tests/support/decision_e2e_kit.py: the real operator on the
local cluster, REAL decision servers per version scraped by the real Prometheus): `status --timeout` exits 0 once
promoted and 9 once rolled back; the dashboard, read in a real headless Chromium, shows that rollback (phases in order,
the 10% step, the failing gate marked) and a screenshot of it is kept; `diagnose` reads Prometheus and names the
rolled-back promotion and its candidate's failing upstream. The dashboard's overview of 200 models loads in under 1 s.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from arbiter_operator.cli.cluster import Cluster
from arbiter_operator.cli.dashboard.server import Dashboard
from arbiter_operator.cli.kubectl_arbiter import main
from kubernetes import client
from support.decision_e2e_kit import DecisionE2E
from support.e2e_kit import V1, V2, e2e_fixture, fast_canary
from support.plannerdrive import two_versions
from support.promstack import module_stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ANALYSIS = {"intervalSeconds": 5, "minRequests": 20, "insufficientTraffic": "Wait", "p95LatencyMs": 3000}
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

stack = module_stack()

e2e = e2e_fixture(DecisionE2E)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven through chromedriver (hack/setup.sh installs both)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: bash hack/setup.sh installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,1600", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def stable_on_v1(e: DecisionE2E, candidate: str = "healthy", **promote) -> None:
    e.create(V1, candidate=candidate, **promote)
    e.wait(lambda: V1 in e.isvcs(), "1.0.0 InferenceService")
    e.set_state(V1, "ready")
    assert e.wait_phase("Idle")["stable"] == V1


def wait_for_status(e: DecisionE2E, timeout: str) -> subprocess.Popen:
    """`kubectl arbiter status NAME --timeout ...` as a pipeline runs it, started before the promotion moves."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.Popen([sys.executable, "-m", "arbiter_operator.cli.kubectl_arbiter", "--kubeconfig",
                             str(e.cp.kubeconfig), "-n", e.ns, "status", e.name, "--timeout", timeout],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def candidate_ready(e: DecisionE2E) -> None:
    e.wait(lambda: V2 in e.isvcs(), "candidate deployed")
    e.set_state(V2, "ready")


def test_status_timeout_exits_0_once_promoted(e2e):
    e = e2e
    stable_on_v1(e, **fast_canary(analysis=ANALYSIS, steps=[{"weight": 10, "holdSeconds": 6}],
                                  rollbackWindowSeconds=0))
    e.patch_promote(version=V2)  # what a pipeline does (a commit, `kubectl arbiter promote`), then it waits
    waiting = wait_for_status(e, "150s")
    candidate_ready(e)
    out, err = waiting.communicate(timeout=180)
    assert waiting.returncode == 0, (out, err)
    assert "1.1.0 is promoted and Ready" in out
    assert "candidate 1.1.0 at 10%" in out  # the canary step went by on the way


def test_a_rollback_fails_the_wait_shows_on_the_dashboard_and_is_diagnosed(e2e, browser, tmp_path):
    e = e2e
    stable_on_v1(e, candidate="fallback", **fast_canary(analysis=ANALYSIS, steps=[{"weight": 10, "holdSeconds": 10}]))
    dash = Dashboard(Cluster(str(e.cp.kubeconfig), namespace=e.ns), False, e.stack.url, 60.0).start()
    try:
        e.wait(lambda: (e.ns, e.name) in dash.store.snapshot()["models"], "the dashboard has listed the model")
        e.patch_promote(version=V2)
        waiting = wait_for_status(e, "150s")
        candidate_ready(e)
        out, err = waiting.communicate(timeout=180)
        assert waiting.returncode == 9, (out, err)
        assert "Stalled: AnalysisFailed" in err and "fallback rate" in err
        e.wait_phase("Failed", timeout=60)
        shot = check_dashboard(browser, dash, e, tmp_path)
        print(f"\ndashboard screenshot kept at {shot}")
    finally:
        dash.stop()
    check_diagnosis(e)


def check_dashboard(browser, dash: Dashboard, e: DecisionE2E, tmp_path: Path) -> Path:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{dash.url}m/{e.ns}/{e.name}")
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr.gate.fail")
                                     and "1.1.0" in b.find_element(By.CSS_SELECTOR, "table.decisions").text)
    phases = [el.get_attribute("data-phase") for el in browser.find_elements(By.CSS_SELECTOR, "rect.phase")]
    assert phases[0] == "Idle" and "Progressing" in phases and phases[-1] == "Failed", phases
    assert phases.index("Progressing") < phases.index("Failed")
    browser.find_element(By.CSS_SELECTOR, "details summary").click()
    steps = browser.find_element(By.CSS_SELECTOR, "table.timeline-data").text
    assert "1.0.0 90%, 1.1.0 10%" in steps and "1.0.0 100%" in steps, steps
    gates = {row.get_attribute("data-gate"): row for row in browser.find_elements(By.CSS_SELECTOR, "tr.gate")}
    judged = {c["name"]: c["verdict"] for c in e.promotion()["lastAnalysis"]["checks"]}
    assert judged["fallbackRate"] == "Fail" and set(gates) == set(judged)
    for name, row in gates.items():  # highlighted exactly where the operator's analysis failed the gate
        failed = judged[name] == "Fail"
        assert ("fail" in row.get_attribute("class").split()) == failed and ("✗ Fail" in row.text) == failed, name
    failing = [gates["fallbackRate"]]
    assert "upstream_error 100.0%" in browser.find_element(By.CSS_SELECTOR, "tr[data-version='1.1.0']").text
    shot = tmp_path / "dashboard-rollback.png"
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shot))
    check_screenshot(shot, browser, failing[0])
    return shot


def check_screenshot(shot: Path, browser, failing_row) -> None:
    """The picture itself: the expected elements inside it, the failing gate's row in its highlight colour, the
    timeline drawn (the rolled-back phase's colour in its band)."""
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    scale = image.width / browser.execute_script("return window.innerWidth")
    for css in ("h1", "svg.timeline", "table.gates", "table.decisions"):
        box = browser.find_element("css selector", css).rect
        assert box["y"] * scale < image.height and box["width"] > 0, css
    def near(px: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
        return all(abs(a - b) <= 4 for a, b in zip(px, want, strict=True))

    row = failing_row.rect
    x, y = int((row["x"] + 4) * scale), int((row["y"] + row["height"] / 2) * scale)
    assert near(image.getpixel((x, y)), (0xFB, 0xE9, 0xE1)), image.getpixel((x, y))  # tr.gate.fail's background
    band = browser.find_elements("css selector", "rect.phase[data-phase='Failed']")[-1].rect
    px = image.getpixel((int((band["x"] + band["width"] / 2) * scale), int((band["y"] + 3) * scale)))
    assert near(px, (0xD5, 0x5E, 0x00)), px  # the Failed phase's colour


def check_diagnosis(e: DecisionE2E) -> None:
    out = io.StringIO()
    code = main(["--kubeconfig", str(e.cp.kubeconfig), "-n", e.ns, "diagnose", e.name, "--prometheus", e.stack.url,
                 "--window", "2m", "-o", "json"], out=out)
    found = json.loads(out.getvalue())
    codes = [f["code"] for f in found["findings"]]
    assert code == 11 and codes[0] == "AnalysisFailed", codes
    assert any(line.startswith("gate fallbackRate") for line in found["findings"][0]["evidence"])
    upstream = next(f for f in found["findings"] if f["code"] == "UpstreamErrors")
    assert upstream["version"] == V2 and "Prometheus" in upstream["evidence"][0]


def test_the_overview_of_200_models_loads_in_under_a_second(control_plane, namespace, browser):
    api = control_plane.api_client()
    objs = client.CustomObjectsApi(api)
    body = two_versions()
    for i in range(200):
        body["metadata"] = {"name": f"model-{i:03d}"}
        objs.create_namespaced_custom_object("arbiter.dev", "v1alpha1", namespace, "decisionmodels", body)
    api.close()
    dash = Dashboard(Cluster(str(control_plane.kubeconfig), namespace=namespace), False, None, 600.0).start()
    try:
        deadline = time.monotonic() + 30
        while len(dash.store.snapshot()["models"]) < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        loads = []
        for _ in range(3):
            browser.get(dash.url)
            loads.append(browser.execute_script(
                "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"))
            assert len(browser.find_elements("css selector", "table.models tbody tr")) == 200
        print(f"\noverview of 200 models: page load {', '.join(f'{ms:.0f}' for ms in loads)} ms")
        assert min(loads) < 1000, loads
    finally:
        dash.stop()
