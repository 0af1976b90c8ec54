"""/api/docs/ (Swagger UI) and /api/redoc/ (ReDoc) render the API's operations in a real
browser that can reach nothing but the server: their scripts are our own static files
(drf-spectacular-sidecar), not a CDN's, and no font, script or image is asked of the
internet. The front page (`/`) likewise."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.browser.conftest import requested

pytestmark = [pytest.mark.django_db, pytest.mark.browser]


def rendered(browser: Any, selector: str, at_least: int) -> int:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def enough(driver: Any) -> int | bool:
        found = len(driver.find_elements(By.CSS_SELECTOR, selector))
        return found if found >= at_least else False

    return int(WebDriverWait(browser, 30).until(enough))


def test_swagger_ui_renders_every_operation_offline(
    browser: Any, live_server: Any, screenshots: Path
) -> None:
    browser.get(f"{live_server.url}/api/docs/")

    operations = rendered(browser, ".opblock", at_least=30)

    browser.save_screenshot(str(screenshots / "api-docs.png"))
    assert operations >= 30
    assert "Run orchestrator API" in browser.page_source
    assert "cdn.jsdelivr.net" not in browser.page_source


def test_redoc_renders_the_operations_offline(
    browser: Any, live_server: Any, screenshots: Path
) -> None:
    browser.get(f"{live_server.url}/api/redoc/")

    operations = rendered(browser, "[data-section-id^='operation/']", at_least=30)

    browser.save_screenshot(str(screenshots / "api-redoc.png"))
    assert operations >= 30


def beyond_the_loopback(urls: list[str]) -> list[str]:
    local = ("127.0.0.1", "localhost", "[::1]")
    return [
        url
        for url in urls
        if not url.startswith(("data:", "blob:", "about:"))
        and (urlsplit(url).hostname or "") not in local
        and not (urlsplit(url).hostname or "").startswith("127.")
    ]


@pytest.mark.parametrize(
    ("path", "rendered_when", "at_least"),
    [
        ("/api/docs/", ".opblock", 30),
        ("/api/redoc/", "[data-section-id^='operation/']", 30),
        ("/", "a#dashboard", 1),
    ],
)
def test_the_docs_and_front_page_ask_nothing_of_the_internet(
    browser: Any, live_server: Any, path: str, rendered_when: str, at_least: int
) -> None:
    requested(browser)  # what earlier pages asked: not this one's

    browser.get(f"{live_server.url}{path}")
    rendered(browser, rendered_when, at_least=at_least)
    asked = requested(browser)

    assert any(url.startswith(live_server.url) for url in asked), asked
    assert beyond_the_loopback(asked) == []
