"""Reads of the rate limits."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from billing.models import Organization
from ratelimits.models import RateLimit

# The global limits (one per tool, set by operators) are read by every step a worker
# claims: they are kept this long per process, so a new one applies within it.
TOOL_LIMITS_TTL_S = 5.0
_tool_limits: tuple[float, dict[str, RateLimit]] = (0.0, {})


def rate_limit_list(organization: Organization) -> QuerySet[RateLimit]:
    return RateLimit.objects.filter(organization=organization).order_by("name")


def rate_limit_get(organization: Organization, name: str) -> RateLimit | None:
    return RateLimit.objects.filter(organization=organization, name=name).first()


def limits_named(organization_id: Any, names: Iterable[str]) -> dict[str, RateLimit]:
    """The organization's limits among ``names``, by name."""
    found = RateLimit.objects.filter(organization_id=organization_id, name__in=set(names))
    return {limit.name: limit for limit in found}


def tool_limit(tool: str) -> RateLimit | None:
    """The global limit on ``tool``, if operators set one (read at most every
    ``TOOL_LIMITS_TTL_S`` per process)."""
    global _tool_limits
    read_at, limits = _tool_limits
    if time.monotonic() - read_at > TOOL_LIMITS_TTL_S:
        limits = {
            limit.tool: limit for limit in RateLimit.objects.filter(organization__isnull=True)
        }
        _tool_limits = (time.monotonic(), limits)
    return limits.get(tool)


def forget_tool_limits() -> None:
    """Read the global limits afresh at the next step (tests, and after a change here)."""
    global _tool_limits
    _tool_limits = (0.0, {})
