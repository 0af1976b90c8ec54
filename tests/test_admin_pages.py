"""Every admin page renders: the change list of each registered model, and the change
page of one of its rows, with rows of every kind present (a page that breaks on a field
or a link shows here, whichever app it belongs to)."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Model
from django.test import Client
from django.urls import reverse

from ratelimits.models import RateLimit
from schedules import services as schedule_services
from tests import admin_rows, factories
from tests.schedules.conftest import make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows_of_every_kind() -> None:
    admin_rows.rows_of_every_kind()


@pytest.mark.usefixtures("rows_of_every_kind")
@pytest.mark.parametrize(
    "model", list(admin.site._registry), ids=lambda m: f"{m._meta.app_label}.{m.__name__}"
)
def test_every_admin_page_renders(operator: Client, model: type[Model]) -> None:
    info = (model._meta.app_label, model._meta.model_name)
    listing = operator.get(reverse("admin:{}_{}_changelist".format(*info)))
    assert listing.status_code == 200, listing.content[:500]
    row = model._default_manager.order_by("pk").first()
    if row is not None:
        # Quoted as the admin's own links are: a runner's id "rnr_2f..." unquoted is "rnr/...".
        page = operator.get(reverse("admin:{}_{}_change".format(*info), args=[quote(row.pk)]))
        assert page.status_code == 200, page.content[:500]


def test_times_are_shown_with_their_zone_and_periods_in_human_units(operator: Client) -> None:
    organization = factories.org()
    RateLimit.objects.create(
        organization=organization, name="openai-tokens", limit=90_000, period_ms=60_000
    )
    RateLimit.objects.create(organization=organization, name="burst", limit=5, period_ms=5_000)
    # Created at 2026-05-01 12:00 UTC: first due at 01:30 in Paris, 23:30 UTC.
    make_schedule(organization, name="nightly", cron="30 1 * * *", timezone_name="Europe/Paris")
    paused = make_schedule(organization, name="hourly", interval="1h")
    schedule_services.schedule_pause(schedule_id=paused.pk)
    factories.run(organization)

    limits = page(operator, "admin:ratelimits_ratelimit_changelist")
    schedules = page(operator, "admin:schedules_schedule_changelist")
    runs = page(operator, "admin:runs_run_changelist")
    index = page(operator, "admin:index")

    assert '<td class="field-period">1 min</td>' in limits
    assert '<td class="field-period">5 s</td>' in limits
    assert "60000" not in limits
    assert "cron 30 1 * * * (Europe/Paris)" in schedules
    assert '<td class="field-next_due">2026-05-02 01:30 Europe/Paris</td>' in schedules
    assert '<td class="field-next_due">paused</td>' in schedules
    assert "every 1 h" in schedules
    assert re.search(r'class="field-created_at nowrap">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<', runs)
    assert "Webhook deliveries" in index
    assert "deliverys" not in index


def page(operator: Client, name: str) -> str:
    response = operator.get(reverse(name))
    assert response.status_code == 200
    return response.content.decode()
