"""Quotas: how many of each thing an organization may hold (docs/tenants.md, "Quotas").

- ``webhook_endpoints``, ``schedules``, ``rate_limits``: rows. The service that creates
  one calls ``check_quota`` in its transaction; past the quota nothing is created
  (``QuotaExceeded``, 409 `quota_exceeded`).
- ``event_streams``: streams open at once, counted in Redis while they are open
  (``common.eventstreams.StreamLease``); one more is refused (``TooManyStreams``, 429
  `too_many_streams`).
- ``runner_polls``: runner polls held at once, counted in Redis as streams are
  (``common.leases``, api/runners.py); one more hold is refused (``TooManyPolls``, 429
  `too_many_polls`).
- ``webhooks_in_flight``: webhook deliveries being sent at once. Nothing is refused: the
  sweep's claim (webhooks/sql/webhook_claim.sql, which reads the field and takes the
  setting as its default, the same rule as ``quota_of``) leaves the organization's other
  due deliveries pending until one of its sends ends.
- ``artifacts``, ``artifact_bytes``: the artifacts an organization stores, counted, and
  their bytes, summed (``SUMMED``); the upload's reservation checks both, its size the
  bytes it adds (409 `quota_exceeded`).
- ``parked_waits``: `wait` steps parked on their timers at once
  (``runs.admission.step_admission.timer`` checks it as it parks one); one more fails its attempt
  with `quota_exceeded` (not retried) instead of parking.

Each quota is the organization's own (a ``quota_*`` field) or, empty, its setting
(``QUOTA_*``), read when it is applied: a change takes effect at once. A quota lowered
below what an organization holds removes nothing; it refuses new ones until it holds
fewer. This module owns the rule and counts nothing itself: billing sits below the apps
whose rows count, so each creating service hands it the rows that hold a place (``held``),
the same selector ``GET /api/v1/organization`` counts.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet, Sum

from billing.models import Organization

logger = logging.getLogger(__name__)

WEBHOOK_ENDPOINTS = "webhook_endpoints"
SCHEDULES = "schedules"
RATE_LIMITS = "rate_limits"
EVENT_STREAMS = "event_streams"
RUNNER_POLLS = "runner_polls"
WEBHOOKS_IN_FLIGHT = "webhooks_in_flight"
ARTIFACTS = "artifacts"
ARTIFACT_BYTES = "artifact_bytes"
PARKED_WAITS = "parked_waits"
# quota -> (the organization's field, the setting it defaults to, what it counts)
QUOTAS: dict[str, tuple[str, str, str]] = {
    WEBHOOK_ENDPOINTS: ("quota_webhook_endpoints", "QUOTA_WEBHOOK_ENDPOINTS", "webhook endpoints"),
    SCHEDULES: ("quota_schedules", "QUOTA_SCHEDULES", "schedules"),
    RATE_LIMITS: ("quota_rate_limits", "QUOTA_RATE_LIMITS", "rate limits"),
    EVENT_STREAMS: ("quota_event_streams", "QUOTA_EVENT_STREAMS", "event streams open"),
    RUNNER_POLLS: ("quota_runner_polls", "QUOTA_RUNNER_POLLS", "runner polls held"),
    WEBHOOKS_IN_FLIGHT: (
        "quota_webhooks_in_flight",
        "QUOTA_WEBHOOKS_IN_FLIGHT",
        "webhook deliveries in flight",
    ),
    ARTIFACTS: ("quota_artifacts", "QUOTA_ARTIFACTS", "artifacts stored"),
    ARTIFACT_BYTES: ("quota_artifact_bytes", "QUOTA_ARTIFACT_BYTES", "bytes of artifacts stored"),
    PARKED_WAITS: ("quota_parked_waits", "QUOTA_PARKED_WAITS", "wait steps parked"),
}
# Quotas of an amount, not of rows: the field of the held rows that is summed.
SUMMED: dict[str, str] = {ARTIFACT_BYTES: "size"}
# What a client can do past a quota, where "delete one" is not it.
REMEDIES = {PARKED_WAITS: "let one wake or cancel its run"}
NAMES = tuple(QUOTAS)
FIELDS = tuple(field for field, _, _ in QUOTAS.values())
# The advisory lock namespace of quotas (pg_advisory_xact_lock(namespace, key)).
LOCK_NAMESPACE = 0x71756F74  # "quot"


class QuotaExceeded(Exception):
    """Creating one more would take the organization past its quota ``quota``."""

    code = "quota_exceeded"

    def __init__(self, quota: str, limit: int, used: int = 0, adding: int = 1) -> None:
        if quota in SUMMED:
            message = (
                f"the organization has {used} {QUOTAS[quota][2]}; {adding} more would exceed "
                f"its quota of {limit}; delete some, or ask an operator to raise the quota"
            )
        else:
            remedy = REMEDIES.get(quota, "delete one")
            message = (
                f"the organization has {limit} {QUOTAS[quota][2]}, its quota; {remedy}, or "
                "ask an operator to raise the quota"
            )
        super().__init__(message)
        self.quota = quota
        self.limit = limit

    @property
    def details(self) -> dict[str, Any]:
        return {"quota": self.quota, "limit": self.limit}


class TooManyStreams(Exception):
    """The organization has as many event streams open as its quota allows."""

    code = "too_many_streams"

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(
            f"the organization has {limit} event streams open, its quota; close one, or "
            f"retry in {retry_after} s"
        )
        self.limit = limit
        self.retry_after = retry_after

    @property
    def details(self) -> dict[str, Any]:
        return {"quota": EVENT_STREAMS, "limit": self.limit, "retry_after": self.retry_after}


class TooManyPolls(Exception):
    """The organization has as many runner polls held as its quota allows."""

    code = "too_many_polls"

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(
            f"the organization has {limit} runner polls held, its quota; poll again in "
            f"{retry_after} s, or ask an operator to raise the quota"
        )
        self.limit = limit
        self.retry_after = retry_after

    @property
    def details(self) -> dict[str, Any]:
        return {"quota": RUNNER_POLLS, "limit": self.limit, "retry_after": self.retry_after}


class InvalidQuotas(ValueError):
    code = "invalid_quotas"


def quota_of(organization: Organization, name: str) -> int:
    """The quota ``name`` in force for ``organization`` (as loaded): its own, else the
    setting."""
    field, setting, _ = QUOTAS[name]
    own: int | None = getattr(organization, field)
    return int(getattr(settings, setting)) if own is None else own


def quotas_of(organization: Organization) -> dict[str, int]:
    """Every quota in force for ``organization``, by name."""
    return {name: quota_of(organization, name) for name in NAMES}


def _lock(organization_id: Any, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
            [LOCK_NAMESPACE, f"{organization_id}:{name}"],
        )


def quota_used(name: str, held: QuerySet[Any]) -> int:
    """What ``held`` (the organization's rows that count) take of the quota ``name``: how
    many they are, or, for a quota of an amount (``SUMMED``), their amount."""
    if name in SUMMED:
        return int(held.aggregate(total=Sum(SUMMED[name]))["total"] or 0)
    return held.count()


def check_quota(
    organization: Organization, name: str, *, held: QuerySet[Any], adding: int = 1
) -> None:
    """In the transaction that creates one more of ``name``: refuse it
    (``QuotaExceeded``) when ``held`` (the organization's rows that count) are as many as
    its quota; for a quota of an amount, when ``adding`` more would take their amount
    past it.

    The race it closes: two creates at once each count the rows committed before them,
    both see one place left, and both take it. So the count is taken under a
    transaction-level advisory lock of the organization and the quota: the second waits
    until the first commits (or rolls back), then counts the first's row too. An advisory
    lock, not the organization's row: that row is locked by every credit movement, which
    a create has no business waiting for."""
    if not connection.in_atomic_block:
        raise RuntimeError("check_quota needs the create's transaction (its lock ends with it)")
    _lock(organization.pk, name)
    limit = quota_of(organization, name)
    used = quota_used(name, held)
    if used + adding > limit:
        raise QuotaExceeded(name, limit, used, adding)


def quotas_set(organization_id: Any, *, actor: str, **quotas: int | None) -> dict[str, int]:
    """Set some of the organization's quotas, by name (None: back to the setting; 0
    allows none). They apply from the next create or stream opened; nothing held is
    removed. Returns every quota in force."""
    unknown = set(quotas) - set(NAMES)
    if unknown:
        raise InvalidQuotas(f"unknown quotas: {', '.join(sorted(unknown))}")
    for name, value in quotas.items():
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise InvalidQuotas(f"{name} must be a whole number of at least 0")
    if quotas:
        Organization.objects.filter(pk=organization_id).update(
            **{QUOTAS[name][0]: value for name, value in quotas.items()}
        )
    logger.info("quotas of organization %s set by %s: %s", organization_id, actor, quotas)
    return quotas_of(Organization.objects.get(pk=organization_id))
