"""The dashboard's charts, in a real headless Chromium: a job's metric curves drawn with the
values it reported (read back from the page), new points arriving live over the job's event
stream, its GPU and throughput charts, the cluster over time, and only legal controls."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from ffdl.server.store.db import Store
from ffdl.server.store.models import GpuSample
from tests.dashboard.test_dashboard import browser, console_errors, row_status, text_of
from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

__all__ = ["browser"]  # the fixture, shared with the dashboard's main tests

# Reports two groups, then waits for a file before reporting more: the test decides when.
TRAIN = """
import os, pathlib, time
from ffdl.sdk.api import report
for step in range(1, 6):
    report(step, samples=step * 100, total_steps=10, loss=1.0 / step, accuracy=step / 10)
    time.sleep(0.6)
report(5, group="test", accuracy=0.42)
go = pathlib.Path(os.environ["RESULT_DIR"]) / "go"
while not go.exists():
    time.sleep(0.1)
for step in range(6, 11):
    report(step, samples=step * 100, total_steps=10, loss=1.0 / step, accuracy=step / 10)
"""

# A copy of what every chart draws (charts.js keeps it on window.ffdlChartData).
CHART_DATA_JS = "return JSON.parse(JSON.stringify(window.ffdlChartData || null));"


@pytest.fixture
def chart_server(tmp_path: Path) -> Iterator[LiveServer]:
    config = {**FAST_CONFIG, "cluster_sample_s": 0.5}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as live:
        yield live


def chart_data(driver: WebDriver) -> dict[str, Any]:
    data: Any = driver.execute_script(CHART_DATA_JS)
    return data or {}


def group(driver: WebDriver, name: str) -> dict[str, Any]:
    return dict((chart_data(driver).get("groups") or {}).get(name) or {})


def buttons(driver: WebDriver) -> set[str]:
    return {
        str(b.get_attribute("data-action"))
        for b in driver.find_elements(By.CSS_SELECTOR, "#detail .actions button[data-action]")
        if b.is_displayed()
    }


def test_charts_show_the_jobs_real_values_live_and_only_legal_controls(
    chart_server: LiveServer, browser: WebDriver
) -> None:
    server = chart_server
    job_id = server.submit_ok(
        manifest_yaml("python train.py", name="charted", gpus=1), {"train.py": TRAIN}
    )
    browser.get(f"{server.url}/#token={server.token}")
    wait_for(lambda: row_status(browser, job_id) == "PROCESSING", timeout=30, what="the row")
    # The job has reported its first five steps and its test group, then waits.
    wait_for(
        lambda: (
            len(server.client.get(f"/v1/logs/{job_id}/emetrics?pagesize=100").json()["models"]) == 6
        ),
        timeout=30,
        what="the first six metric records",
    )
    browser.find_element(By.CSS_SELECTOR, f'#jobs tbody tr[data-id="{job_id}"]').click()
    wait_for(lambda: len(group(browser, "train").get("x") or []) == 5, timeout=15, what="5 points")

    train = group(browser, "train")
    assert train["x"] == [1, 2, 3, 4, 5]
    # Every reported metric is a series; the progress fields are not.
    assert set(train["series"]) == {"loss", "accuracy"}
    assert train["series"]["loss"] == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert group(browser, "test") == {"x": [5], "series": {"accuracy": [0.42]}}
    # The same values the API serves.
    api_losses = [
        float(r["values"]["loss"]["value"])
        for r in server.client.get(f"/v1/logs/{job_id}/emetrics?pagesize=100").json()["models"]
        if r["grouplabel"] == "train"
    ]
    assert train["series"]["loss"] == pytest.approx(api_losses)
    # Drawn: one uPlot canvas per group.
    canvases = browser.find_elements(By.CSS_SELECTOR, "#metric-charts .chart canvas")
    assert len(canvases) == 2
    throughput = chart_data(browser).get("throughput") or {}
    # 100 samples every 0.6 s, measured over windows of 2 s or more.
    assert len(throughput.get("samples_per_s") or []) >= 1
    assert all(100 < rate < 200 for rate in throughput["samples_per_s"])
    assert buttons(browser) == {"halt", "delete"}

    # Live: the next five steps arrive over the event stream, without a reload.
    marker = browser.execute_script("window.__noReload = 1; return window.__noReload;")
    Path(server.model(job_id)["results"]["location"], "go").write_text("go")
    wait_for(lambda: len(group(browser, "train").get("x") or []) == 10, timeout=30, what="live")
    assert browser.execute_script("return window.__noReload;") == marker
    assert group(browser, "train")["series"]["accuracy"][-1] == pytest.approx(1.0)

    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    wait_for(
        lambda: text_of(browser, '#summary [data-field="status"]') == "COMPLETED",
        timeout=15,
        what="the detail to show COMPLETED",
    )
    # A COMPLETED job can only be deleted: no Halt, no Resume.
    wait_for(lambda: buttons(browser) == {"delete"}, timeout=10, what="only Delete offered")
    assert text_of(browser, "#timeline .span").startswith("#1 COMPLETED")

    # The GPU chart draws the job's samples (written to its store as a controller would).
    store = Store(f"sqlite:///{server.home / 'ffdl.db'}")
    try:
        with store.write() as session:
            for i, util in enumerate((40.0, 60.0, 80.0)):
                session.add(
                    GpuSample(
                        job_id=job_id,
                        learner=1,
                        attempt=1,
                        node="node-a",
                        time=time.time() - 10 + i,
                        span_s=1.0,
                        util=util,
                        memory_mb=100.0,
                        power_w=None,
                        gpus=[],
                    )
                )
    finally:
        store.dispose()
    browser.find_element(By.ID, "close-detail").click()
    browser.find_element(By.CSS_SELECTOR, f'#jobs tbody tr[data-id="{job_id}"]').click()
    wait_for(lambda: (chart_data(browser).get("gpu") or {}).get("time"), timeout=15, what="GPU")
    assert chart_data(browser)["gpu"]["util"] == {"learner 1": [40.0, 60.0, 80.0]}

    # The cluster over time: samples every half second, refreshed every ten.
    wait_for(
        lambda: len((chart_data(browser).get("cluster") or {}).get("time") or []) >= 2,
        timeout=30,
        what="the cluster chart's points",
    )
    cluster = chart_data(browser)["cluster"]
    assert set(cluster["gpus_total"]) == {4}
    assert browser.find_elements(By.CSS_SELECTOR, "#cluster-gpus canvas")
    assert console_errors(browser) == []
