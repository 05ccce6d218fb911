"""The dashboard's queue and cluster views in a real headless Chromium: queued jobs with their
positions and ETAs, how far the first ETA shown was from the real start, the cluster's GPUs and
queue over time, and a tenant admin who sees only the tenant's own jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from tests.dashboard.test_dashboard import browser, console_errors, row_status, text_of
from tests.dashboard.test_dashboard_charts import chart_data, chart_server
from tests.integration.live import (
    LiveServer,
    manifest_yaml,
    wait_for,
)

__all__ = ["browser", "chart_server"]  # fixtures shared with the other dashboard tests

TEAM_B = "team-b"

# Holds its GPUs until a file appears in its RESULT_DIR: the test decides when it ends.
UNTIL_GO = """
import os, pathlib, time
go = pathlib.Path(os.environ["RESULT_DIR"]) / "go"
while not go.exists():
    time.sleep(0.1)
"""

QUEUE_ROWS_JS = """
return [...document.querySelectorAll('#queue tbody tr')].map(
  (row) => [row.dataset.id, ...[...row.cells].map((cell) => cell.innerText.trim())]);
"""

JOB_IDS_JS = "return [...document.querySelectorAll('#jobs tbody tr')].map((r) => r.dataset.id);"


def queue_rows(driver: WebDriver) -> list[list[str]]:
    rows: Any = driver.execute_script(QUEUE_ROWS_JS)
    return [[str(cell) for cell in row] for row in rows or []]


def job_ids(driver: WebDriver) -> set[str]:
    ids: Any = driver.execute_script(JOB_IDS_JS)
    return {str(i) for i in ids or []}


def test_queue_positions_etas_past_estimates_and_a_tenant_admins_view(
    chart_server: LiveServer, browser: WebDriver
) -> None:
    server = chart_server
    assert server.client.post("/v1/tenants", json={"id": TEAM_B}).status_code == 201
    created = server.client.post(
        f"/v1/tenants/{TEAM_B}/users", json={"name": "carol", "role": "admin"}
    )
    assert created.status_code == 201, created.text
    team_admin = str(created.json()["token"])

    files = {"hold.py": UNTIL_GO}
    holder = server.submit_ok(
        manifest_yaml("python hold.py", name="holder", gpus=4, expected_duration="2m"), files
    )
    server.wait_status(holder, {"PROCESSING"}, timeout=60)
    waiting = server.submit_ok(
        manifest_yaml("python hold.py", name="waiting", gpus=4, expected_duration="1m"), files
    )
    theirs = server.submit_ok(
        manifest_yaml("python hold.py", name="theirs", gpus=4, expected_duration="1m"),
        files,
        token=team_admin,
    )

    # The platform admin's queue: both waiting jobs in queue order, each with its ETA, the
    # same positions and ETAs the API serves.
    browser.get(f"{server.url}/#token={server.token}")

    def both_queued() -> list[list[str]] | None:
        rows = queue_rows(browser)
        in_order = [r[0] for r in rows] == [waiting, theirs]
        return rows if in_order and all(r[1].isdigit() and r[4] for r in rows) else None

    rows = wait_for(both_queued, timeout=30, what="both waiting jobs with ETAs in the queue")
    api = {e["model_id"]: e for e in server.client.get("/v1/queue").json()["queue"]}
    assert [r[1] for r in rows] == [str(api[waiting]["position"]), str(api[theirs]["position"])]
    assert [r[1] for r in rows] == ["1", "2"]
    assert "waiting" in rows[0][2] and "theirs" in rows[1][2]
    assert rows[0][4] and rows[1][4] and api[waiting]["eta"] and api[theirs]["eta"]
    assert text_of(browser, f'#jobs tbody tr[data-id="{waiting}"]').count("#1 ETA") == 1
    # Each tenant's GPUs against those it is entitled to, as the API has them: the default
    # tenant holds all 4, team-b none, each entitled to half.
    shares = {row["tenant"]: row for row in server.client.get("/v1/queue").json()["tenants"]}
    assert (shares["default"]["gpus"], shares[TEAM_B]["gpus"]) == (4, 0)
    default_row = text_of(browser, '#tenant-shares tbody tr[data-tenant="default"]')
    assert default_row.split()[:4] == ["default", "4", "2", "2.00×"]
    assert text_of(browser, f'#tenant-shares tbody tr[data-tenant="{TEAM_B}"]').split()[1] == "0"

    # The cluster over time: the holder's 4 GPUs allocated, the queue two long.
    def cluster_seen() -> dict[str, Any] | None:
        cluster = chart_data(browser).get("cluster") or {}
        allocated, queued = cluster.get("gpus_allocated") or [], cluster.get("queue_length") or []
        return cluster if 4 in allocated and 2 in queued else None

    cluster = wait_for(cluster_seen, timeout=40, what="the cluster chart to show the queue")
    assert set(cluster["gpus_total"]) == {4}

    # The holder ends: the first waiting job starts, and the page says how far the first ETA
    # it showed was from the real start, as the API has it.
    Path(server.model(holder)["results"]["location"], "go").write_text("go")
    server.wait_status(waiting, {"PROCESSING", "COMPLETED"}, timeout=60)
    error_s = server.model(waiting)["start_estimate"]["error_s"]
    row = f'#eta-accuracy tbody tr[data-id="{waiting}"]'
    wait_for(lambda: text_of(browser, row), timeout=30, what="the start against its first ETA")
    shown: Any = browser.execute_script(
        "return document.querySelector(arguments[0]).dataset.error;", row
    )
    assert float(shown) == pytest.approx(error_s)
    assert ("later" if error_s > 0 else "earlier") in text_of(browser, row)
    assert console_errors(browser) == []

    # A tenant admin sees the tenant's own jobs and queue only.
    browser.execute_script("localStorage.clear();")
    browser.get("about:blank")  # a new page load, not a same-page change of the fragment
    browser.get(f"{server.url}/#token={team_admin}")
    wait_for(lambda: row_status(browser, theirs) is not None, timeout=30, what="their job")
    assert job_ids(browser) == {theirs}
    wait_for(lambda: [r[0] for r in queue_rows(browser)] == [theirs], timeout=30, what="queue")
    wait_for(
        lambda: text_of(browser, f'#tenant-shares tbody tr[data-tenant="{TEAM_B}"]'),
        timeout=30,
        what="the tenant's own share",
    )
    assert text_of(browser, '#tenant-shares tbody tr[data-tenant="default"]') == ""

    Path(server.model(waiting)["results"]["location"], "go").write_text("go")
    server.wait_status(theirs, {"PROCESSING", "COMPLETED"}, timeout=60)
    Path(server.model(theirs)["results"]["location"], "go").write_text("go")
    server.wait_status(theirs, {"COMPLETED"}, timeout=60)
