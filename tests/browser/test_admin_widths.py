"""The admin's lists fit a 1,280 px screen: in a real headless Chromium at 1280x800, the
last column of every change list (often the status, or the latest time) ends inside the
window and inside the list's own box, not off to the right behind a scroll bar; and each
list could be SPARE px narrower still, so that longer names do not push it over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.urls import reverse

from runs.models import RunEvent
from tests import admin_rows
from tests.browser.conftest import log_in
from webhooks import services as webhook_services

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 800
# Pixels each list must have to spare at its narrowest (every cell wrapped at its spaces).
SPARE = 40
LONG_URL = "https://hooks.acme-analytics.example.com/orchestrator/v2/notifications?team=finance"
# The lists operators open most: each must have rows when measured.
MAIN_LISTS = (
    "runs.run",
    "runs.runnerjob",
    "runs.stepwait",
    "runs.runevent",
    "webhooks.webhookdelivery",
    "webhooks.webhookendpoint",
    "schedules.schedule",
    "schedules.schedulefire",
    "ratelimits.ratelimit",
)
# The right edge of the list's last column, of the window and of the list's box.
MEASURE = r"""
const table = document.querySelector('#result_list');
if (!table) { return null; }
const text = (cell) => cell.textContent.replace(/\s+/g, ' ').trim();
let right = 0;
for (const cell of table.querySelectorAll('tr > :last-child')) {
  right = Math.max(right, cell.getBoundingClientRect().right);
}
const box = table.closest('.results') || table.parentElement;
const heads = Array.from(table.querySelectorAll('thead th'));
// The narrowest the list can be, every cell wrapped at its spaces.
table.style.width = 'min-content';
const narrowest = table.getBoundingClientRect().width;
table.style.width = '';
return {
  narrowest: narrowest,
  boxWidth: box.getBoundingClientRect().width,
  right: right,
  window: document.documentElement.clientWidth,
  box: box.getBoundingClientRect().right,
  rows: table.querySelectorAll('tbody tr').length,
  column: text(heads[heads.length - 1]),
  widths: heads.map((th) => `${text(th)} ${Math.round(th.getBoundingClientRect().width)} px`)
    .join(', '),
};
"""


def test_every_change_list_fits_a_1280_pixel_window(
    browser: Any, live_server: Any, screenshots: Path
) -> None:
    # Names and URLs as long as real ones: they are what widens a column.
    organization = admin_rows.rows_of_every_kind("Acme Analytics Europe (production)")
    endpoint, _ = webhook_services.endpoint_create(
        organization=organization, url=LONG_URL, events=["run.completed", "run.failed"]
    )
    webhook_services.endpoint_test(endpoint_id=endpoint.pk)
    log_in(browser, live_server.url)
    browser.set_window_size(WIDTH, HEIGHT)

    measured: dict[str, dict[str, Any]] = {}
    for model in admin.site._registry:
        label = f"{model._meta.app_label}.{model._meta.model_name}"
        path = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        if label == "runs.runevent":
            # The events are listed one run at a time (its page links there).
            path += f"?run__id__exact={RunEvent.objects.values_list('run_id', flat=True).first()}"
        browser.get(f"{live_server.url}{path}")
        found = browser.execute_script(MEASURE)
        if found is not None:
            measured[label] = found
        if label in MAIN_LISTS:
            browser.save_screenshot(str(screenshots / f"admin-list-{label}.png"))

    for label in MAIN_LISTS:
        assert measured.get(label, {}).get("rows"), f"{label}: no rows to measure"
    overflowing = [
        f"{label}: its last column ({found['column']}) ends at {found['right']:.0f} px, "
        f"the list's box at {found['box']:.0f} px (columns: {found['widths']})"
        for label, found in measured.items()
        if found["right"] > min(found["window"], found["box"]) + 1
    ]
    assert not overflowing, "\n".join(overflowing)
    # And with room to spare: a longer name, or a time of wider digits, still fits.
    tight = [
        f"{label}: {found['boxWidth'] - found['narrowest']:.0f} px to spare "
        f"(columns: {found['widths']})"
        for label, found in measured.items()
        if found["boxWidth"] - found["narrowest"] < SPARE
    ]
    assert not tight, "\n".join(tight)
