"""The web dashboard served at ``/``, driven in a real headless Chromium against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.command import Command

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1300",
)

RUNNING_JOB = (
    "python -c \"import time; [print(f'dashboard line {i}', flush=True) for i in range(3)]; "
    'time.sleep(20)"'
)

# Reads a job row's badge in the page itself, so a refresh between lookups cannot leave the
# test holding a detached element.
ROW_STATUS_JS = """
const badge = document.querySelector(`#jobs tbody tr[data-id="${arguments[0]}"] [data-status]`);
return badge ? badge.dataset.status : null;
"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is not installed: apt-get install chromium chromium-driver")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def row_status(driver: WebDriver, job_id: str) -> str | None:
    status: Any = driver.execute_script(ROW_STATUS_JS, job_id)
    return None if status is None else str(status)


def text_of(driver: WebDriver, css: str) -> str:
    # Read in the page in one step: a re-render between a lookup and its read cannot leave
    # the test holding a detached element.
    text: Any = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(text or "").strip()


def console_errors(driver: WebDriver) -> list[dict[str, Any]]:
    # ``get_log`` is untyped; the command underneath it is the same and typed.
    entries: list[dict[str, Any]] = driver.execute(Command.GET_LOG, {"type": "browser"})["value"]
    return [entry for entry in entries if entry.get("level") == "SEVERE"]


def test_static_assets_are_served_without_auth_and_stay_inside_their_folder(
    server: LiveServer,
) -> None:
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="token-form"' in page.text
    script = httpx.get(f"{server.url}/static/app.js", timeout=10)
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{server.url}/static/style.css", timeout=10).status_code == 200
    for outside in ("/static/..%2F..%2Fserver%2Fapp.py", "/static/missing.js", "/static/.hidden"):
        response = httpx.get(f"{server.url}{outside}", timeout=10)
        assert response.status_code == 404, outside
        assert "error" in response.json()
    # The API keeps its own routes and still demands a token.
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401


def test_job_is_followed_and_halted_from_the_dashboard(
    server: LiveServer, browser: WebDriver, tmp_path: Path
) -> None:
    running = server.submit_ok(manifest_yaml(RUNNING_JOB, name="dashboard-run"))
    # Needs every GPU of the only node while the first job holds one, so it waits in the queue.
    waiting = server.submit_ok(manifest_yaml(RUNNING_JOB, name="dashboard-wait", gpus=4))

    browser.get(f"{server.url}/#token={server.token}")
    wait_for(
        lambda: row_status(browser, running) == "PROCESSING",
        timeout=30,
        what="the job's row to show PROCESSING",
    )
    assert "token=" not in browser.current_url
    assert browser.execute_script("return localStorage.getItem('ffdl.token')") == server.token
    row = browser.find_element(By.CSS_SELECTOR, f'#jobs tbody tr[data-id="{running}"]')
    assert "dashboard-run" in row.text
    assert "1×1" in row.text

    wait_for(
        lambda: text_of(browser, f'#queue tbody tr[data-id="{waiting}"]'),
        timeout=10,
        what="the waiting job in the queue panel",
    )
    assert "dashboard-wait" in text_of(browser, f'#queue tbody tr[data-id="{waiting}"]')
    wait_for(
        lambda: running in text_of(browser, '#nodes tbody tr[data-name="node-a"]'),
        timeout=10,
        what="node-a to list the running job as a holder",
    )
    # node-a is a host without GPUs (gpu_type cpu): its slots say so.
    node_row = text_of(browser, '#nodes tbody tr[data-name="node-a"]')
    assert "1/4 CPU slots" in node_row and f"{running} #1 CPU slot 0" in node_row, node_row

    row.click()
    wait_for(
        lambda: "dashboard line 2" in browser.find_element(By.ID, "logs").text,
        timeout=15,
        what="the job's log lines in #logs",
    )
    assert browser.find_element(By.ID, "detail").is_displayed()
    assert text_of(browser, '#summary [data-field="status"]') == "PROCESSING"
    assert "PROCESSING" in browser.find_element(By.ID, "events").text

    # Only what a PROCESSING job takes is offered: no Resume.
    assert not browser.find_element(By.ID, "resume").is_displayed()
    assert browser.find_element(By.ID, "delete").is_displayed()
    browser.find_element(By.ID, "halt").click()
    wait_for(
        lambda: row_status(browser, running) == "HALTED",
        timeout=30,
        what="the job's row to show HALTED",
    )
    assert server.status(running) == "HALTED"
    wait_for(
        lambda: text_of(browser, '#summary [data-field="status"]') == "HALTED",
        timeout=10,
        what="the detail pane to show HALTED",
    )
    assert "halt accepted" in browser.find_element(By.ID, "detail-message").text
    # A HALTED job resumes; it cannot be halted again.
    wait_for(
        lambda: browser.find_element(By.ID, "resume").is_displayed(),
        timeout=10,
        what="Resume offered for the HALTED job",
    )
    assert not browser.find_element(By.ID, "halt").is_displayed()

    screenshot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 0
    assert console_errors(browser) == []


def test_wrong_token_shows_the_token_form_with_the_reason(
    server: LiveServer, browser: WebDriver
) -> None:
    browser.get(f"{server.url}/#token=not-a-real-token")
    wait_for(
        lambda: (
            browser.find_element(By.ID, "token-form").is_displayed()
            and browser.find_element(By.ID, "token-error").text
        ),
        timeout=15,
        what="the token form with an error",
    )
    assert "invalid or revoked token" in browser.find_element(By.ID, "token-error").text
    assert not browser.find_element(By.ID, "dashboard").is_displayed()
    assert browser.execute_script("return localStorage.getItem('ffdl.token')") is None

    # The form recovers the session with the right token.
    browser.find_element(By.ID, "token-input").send_keys(server.token)
    browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    wait_for(
        lambda: browser.find_element(By.ID, "jobs-empty").is_displayed(),
        timeout=15,
        what="the empty jobs table after signing in",
    )
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    assert not browser.find_element(By.ID, "token-error").is_displayed()


def test_an_unsandboxed_platform_in_clear_text_says_so_on_health_and_the_dashboard(
    tmp_path: Path, browser: WebDriver
) -> None:
    # Learners would send their job tokens to a non-loopback address over plain HTTP (a
    # documentation address: no job runs, so nothing is sent there).
    exposed = "http://192.0.2.7:8080"
    config = {**FAST_CONFIG, "sandbox": False, "advertise_url": exposed}
    with serving(LiveServer(home=tmp_path / "bare", config=config)) as bare:
        health = httpx.get(f"{bare.url}/health", timeout=10).json()
        assert health["sandbox"] is False and "not sandboxed" in health["warning"]
        assert health["tls"] is False and exposed in health["transport_warning"]
        assert "NOT SANDBOXED" in bare.log_tail(200)
        assert "PLAIN HTTP: credentials cross the network in clear text" in bare.log_tail(200)
        browser.get(f"{bare.url}/")
        wait_for(lambda: browser.find_element(By.ID, "sandbox-warning").is_displayed())
        assert "--no-sandbox" in text_of(browser, "#sandbox-warning")
        wait_for(lambda: browser.find_element(By.ID, "transport-warning").is_displayed())
        assert "--tls-cert" in text_of(browser, "#transport-warning")


def test_a_sandboxed_platform_shows_no_warning(server: LiveServer, browser: WebDriver) -> None:
    assert httpx.get(f"{server.url}/health", timeout=10).json()["sandbox"] is True
    browser.get(f"{server.url}/#token={server.token}")
    wait_for(lambda: browser.find_element(By.ID, "dashboard").is_displayed())
    assert not browser.find_element(By.ID, "sandbox-warning").is_displayed()
    assert not browser.find_element(By.ID, "transport-warning").is_displayed()
