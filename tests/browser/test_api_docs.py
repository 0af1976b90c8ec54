"""/api/docs/ (Swagger UI) and /api/redoc/ (ReDoc) render the API's operations in a real
browser that can reach nothing but the server: their scripts are our own static files
(drf-spectacular-sidecar), not a CDN's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
