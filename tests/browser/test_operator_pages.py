"""An operator's first day, in a real headless Chromium against the live server and a real
worker: log in to the admin, open a live run, watch its graph's nodes change status,
approve its gate from the page, and open the dashboard from the admin's index.
Screenshots of each page are kept as test artefacts (TEST_SCREENSHOTS_DIR);
docs/screenshots/ holds copies for docs/operations.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, Step
from runs.selectors import run_history
from tests.browser.conftest import log_in
from tests.factories import step
from tests.integration.engine_support import submit

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
]


def plan() -> dict[str, Any]:
    """A DAG that takes a few seconds, then a gate only people can open."""
    return {
        "name": "nightly-report",
        "mode": "dag",
        "agents": [
            {
                "name": "fetch",
                "tasks": [
                    {
                        "name": "sources",
                        "mode": "dag",
                        "steps": [
                            step("list", "sleep", params={"seconds": 3}),
                            step("orders", "sleep", params={"seconds": 0.5}, depends_on=["list"]),
                            step("refunds", "echo", params={"n": 1}, depends_on=["list"]),
                            step("merge", "noop", depends_on=["orders", "refunds"]),
                        ],
                    }
                ],
            },
            {
                "name": "publish",
                "depends_on": ["fetch"],
                "tasks": [
                    {
                        "name": "release",
                        "steps": [step("sign-off", "approval"), step("upload", "noop")],
                    }
                ],
            },
        ],
    }


def wait(browser: Any, condition: Any, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.2).until(condition)


def status_of(browser: Any, dom_id: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.ID, dom_id).get_attribute("data-status"))
    except (NoSuchElementException, StaleElementReferenceException):
        return None  # the page is being drawn again


def test_an_operator_watches_a_live_run_and_approves_its_gate_from_the_page(
    browser: Any, live_server: Any, celery_worker: str, screenshots: Path
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, live_server.url)
    run = submit(plan())
    page = f"{live_server.url}/admin/runs/run/{run.pk}/change/"
    browser.set_window_size(1400, 1300)
    browser.get(page)
    # Picked up by the worker (its steps made) a moment later: the page draws itself again.
    merge = wait(browser, lambda _: Step.objects.filter(run=run, name="merge").first())
    listing = Step.objects.get(run=run, name="list")
    first_seen = wait(browser, lambda driver: status_of(driver, f"n-s{merge.pk}"))

    # The page polls its live endpoint: nodes change colour as the worker moves on.
    wait(browser, lambda driver: status_of(driver, f"n-s{listing.pk}") == "completed")
    wait(browser, lambda driver: status_of(driver, f"n-s{merge.pk}") == "completed")
    assert first_seen == "pending"
    browser.save_screenshot(str(screenshots / "run-page-live.png"))

    gate = Step.objects.get(run=run, name="sign-off")
    approve = wait(browser, lambda driver: driver.find_elements(By.ID, f"approve-{gate.pk}"))
    assert status_of(browser, f"n-s{gate.pk}") == "waiting_approval"
    browser.save_screenshot(str(screenshots / "run-page-waiting.png"))
    approve[0].click()
    wait(browser, lambda driver: driver.find_elements(By.ID, "confirm-control"))
    assert "Approve step publish.release.sign-off of this run?" in browser.page_source
    browser.find_element(By.ID, "id_comment").send_keys("numbers checked")
    browser.find_element(By.ID, "confirm-yes").click()

    wait(browser, lambda driver: "Approve: done" in driver.page_source)
    wait(
        browser,
        lambda driver: driver.find_elements(By.CSS_SELECTOR, "#run-status.st-completed"),
    )
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert (
        run_history(run)
        .filter(kind="approval", actor="admin:ops", message="numbers checked")
        .exists()
    )
    assert status_of(browser, f"n-s{gate.pk}") == "completed"
    assert browser.find_elements(By.CSS_SELECTOR, "#run-gantt rect.seg.run")
    browser.save_screenshot(str(screenshots / "run-page.png"))

    # The dashboard, from the admin's index: the run just finished, the worker online.
    browser.get(f"{live_server.url}/admin/")
    browser.find_element(By.ID, "dashboard-link").click()
    wait(browser, lambda driver: driver.find_elements(By.ID, "dashboard"))
    for panel in ("runs", "throughput", "failures", "queues", "workers", "pending", "escalations"):
        assert browser.find_elements(By.ID, f"panel-{panel}"), panel
    completed = browser.find_element(By.CSS_SELECTOR, '#panel-runs [data-status="completed"]')
    assert "1" in completed.text
    workers = browser.find_elements(By.CSS_SELECTOR, "#panel-workers [data-worker]")
    assert celery_worker in [worker.get_attribute("data-worker") for worker in workers]
    browser.save_screenshot(str(screenshots / "dashboard.png"))
