"""A real headless Chromium for browser tests: Debian's `chromium` driven through its
`chromedriver` (never a browser or driver downloaded by a test tool: `make test`
installs both from Debian when missing).

The browser resolves no name but the loopback's (`--host-resolver-rules`), so a page
that reaches for the internet (a CDN) fails here as it would on a machine without
access, and no test opens a connection beyond 127.0.0.0/8. It also records every
request its pages make (`requested`), so a test can fail on one that leaves the
loopback; `log_in` signs an operator in to the admin. Screenshots go to
TEST_SCREENSHOTS_DIR (default: <tmp>/orchestrator-test-screenshots)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def screenshots() -> Path:
    default = Path(tempfile.gettempdir()) / "orchestrator-test-screenshots"
    directory = Path(os.environ.get("TEST_SCREENSHOTS_DIR") or default)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(binary):
            pytest.fail(f"{binary} is missing: `make test` installs chromium and chromium-driver")
    # Selenium Manager would fetch a driver of its own when it finds none: never here.
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(argument)
    # Network events in the performance log: what `requested` reads.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    options.add_experimental_option(
        "perfLoggingPrefs", {"enableNetwork": True, "enablePage": False}
    )
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def requested(browser: Any) -> list[str]:
    """The URLs the browser's pages asked for since the last call, whether or not they
    could be reached (a name that does not resolve was still asked for), except those the
    page's own Content-Security-Policy stopped: those never left the browser."""
    asked: dict[str, str] = {}
    stopped = set()
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message["params"]
        if message["method"] == "Network.requestWillBeSent":
            asked[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
            stopped.add(params["requestId"])
    return [url for request_id, url in asked.items() if request_id not in stopped]


def log_in(browser: Any, url: str) -> None:
    """Sign in to the admin at ``url`` as a new superuser."""
    from django.contrib.auth.models import User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    password = "a-long-operator-password"
    User.objects.create_superuser("ops", "ops@example.com", password)
    browser.get(f"{url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda driver: "Site administration" in driver.page_source)
