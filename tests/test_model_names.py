"""Every model's plural reads as English in the admin ("Webhook deliveries", never
"Webhook deliverys"): each of ours named here, and no model at all with a plural Django
made by adding "s" where English changes the word."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.db.models import Model

# Our apps' models and their plurals, as the admin's index and titles show them. A new
# model is added here, its plural checked by a reader.
PLURALS = {
    "api.IdempotencyRecord": "idempotency records",
    "artifacts.Artifact": "artifacts",
    "artifacts.OrganizationStorage": "organization storage",
    "billing.ApiKey": "API keys",
    "billing.LedgerEntry": "ledger entries",
    "billing.Organization": "organizations",
    "billing.Reservation": "reservations",
    "billing.Secret": "secrets",
    "ratelimits.RateGrant": "rate grants",
    "ratelimits.RateLimit": "rate limits",
    "runs.Agent": "agents",
    "runs.EscalationTicket": "escalation tickets",
    "runs.FairTurn": "fair turns",
    "runs.Notification": "notifications",
    "runs.Replan": "replans",
    "runs.Run": "runs",
    "runs.RunAttempt": "run attempts",
    "runs.RunEvent": "run events",
    "runs.HistoryEvent": "history events",
    "runs.PublishedTool": "published tools",
    "runs.Runner": "runners",
    "runs.RunnerJob": "runner jobs",
    "runs.Step": "steps",
    "runs.StepCacheEntry": "step cache entries",
    "runs.StepFailure": "step failures",
    "runs.StepSlot": "step slots",
    "runs.StepWait": "step waits",
    "runs.Task": "tasks",
    "schedules.Schedule": "schedules",
    "schedules.ScheduleFire": "schedule fires",
    "webhooks.WebhookAttempt": "webhook attempts",
    "webhooks.WebhookDelivery": "webhook deliveries",
    "webhooks.WebhookEndpoint": "webhook endpoints",
}
OURS = {
    "api",
    "artifacts",
    "billing",
    "orchestrator",
    "ratelimits",
    "runs",
    "schedules",
    "webhooks",
}
# What Django's default plural (the name and an "s") gets wrong in English: "entrys",
# "deliverys" (a consonant and y), "addresss", "boxs", "batchs", "wishs".
NOT_ENGLISH = re.compile(r"([^aeiou]ys|sss|xs|chs|shs|zs)$")


def test_each_of_our_models_has_its_english_plural() -> None:
    ours = {
        model._meta.label: str(model._meta.verbose_name_plural)
        for model in apps.get_models()
        if model._meta.app_label in OURS
    }

    assert ours == PLURALS


@pytest.mark.parametrize("model", apps.get_models(), ids=lambda model: model._meta.label)
def test_no_plural_is_a_word_and_an_s_where_english_says_otherwise(model: type[Model]) -> None:
    plural = str(model._meta.verbose_name_plural)

    assert not NOT_ENGLISH.search(plural), f"{model._meta.label}: {plural!r}"
