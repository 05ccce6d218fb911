"""The dashboard's detail pane lists a job's attempts, in a real headless Chromium."""

from __future__ import annotations

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.dashboard.test_dashboard import browser, console_errors, row_status, text_of
from tests.integration.live import LiveServer, manifest_yaml, wait_for

__all__ = ["browser"]  # the fixture, shared with the dashboard's main tests

CRASH = "python -c \"import sys; print('no data here', flush=True); sys.exit(4)\""


def test_the_detail_pane_lists_every_attempt(server: LiveServer, browser: WebDriver) -> None:
    job_id = server.submit_ok(manifest_yaml(CRASH, name="crashes", gpus=0, max_restarts=1))
    server.wait_status(job_id, {"FAILED"}, timeout=60)

    browser.get(f"{server.url}/#token={server.token}")
    wait_for(lambda: row_status(browser, job_id) == "FAILED", timeout=30, what="the job's row")
    browser.find_element(By.CSS_SELECTOR, f'#jobs tbody tr[data-id="{job_id}"]').click()
    wait_for(
        lambda: text_of(browser, '#summary [data-field="attempts"] li[data-attempt="2"]'),
        timeout=15,
        what="the second attempt in the detail pane",
    )
    first = text_of(browser, '#summary [data-field="attempts"] li[data-attempt="1"]')
    second = text_of(browser, '#summary [data-field="attempts"] li[data-attempt="2"]')
    assert first.startswith("#1 FAILED") and "restart 1 of 1 after learner 1" in first
    assert second.startswith("#2 FAILED") and "exited with code 4" in second
    assert "automatic restarts: 1 of 1" in text_of(browser, '#summary [data-field="attempts"]')
    assert console_errors(browser) == []
