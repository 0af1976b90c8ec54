"""How much an organization may hold (docs/configuration.md, "Quotas"; docs/tenants.md)."""

from __future__ import annotations

from config.settings.environment import env

# --------------------------------------------------------------------------- quotas
# How many of each thing an organization may hold (docs/tenants.md); an organization's
# own quota (the admin, `manage.py set_limits`) overrides each. Creating one more is
# refused (409 quota_exceeded); opening one more event stream, 429 too_many_streams.
QUOTA_WEBHOOK_ENDPOINTS = env.integer(
    "QUOTA_WEBHOOK_ENDPOINTS", 20, "webhook endpoints an organization may have", minimum=0
)
QUOTA_SCHEDULES = env.integer(
    "QUOTA_SCHEDULES", 100, "schedules an organization may have", minimum=0
)
QUOTA_RATE_LIMITS = env.integer(
    "QUOTA_RATE_LIMITS", 100, "rate limits an organization may have", minimum=0
)
QUOTA_EVENT_STREAMS = env.integer(
    "QUOTA_EVENT_STREAMS", 50, "event streams an organization may have open at once", minimum=0
)
# Holds: what an organization keeps busy at once. Past QUOTA_RUNNER_POLLS a poll that
# would be held is refused (429 too_many_polls); past QUOTA_WEBHOOKS_IN_FLIGHT its due
# deliveries wait, pending, for one of its sends to end (the webhooks process has
# WEBHOOK_CONCURRENCY threads for every organization).
QUOTA_RUNNER_POLLS = env.integer(
    "QUOTA_RUNNER_POLLS", 100, "runner polls an organization may have held at once", minimum=0
)
QUOTA_WEBHOOKS_IN_FLIGHT = env.integer(
    "QUOTA_WEBHOOKS_IN_FLIGHT",
    5,
    "webhook deliveries of an organization sent at once",
    minimum=0,
)
# What an organization's artifacts may hold in storage, all runs together (one run may
# hold ARTIFACT_RUN_MAX_BYTES): an upload past either is refused (409 quota_exceeded).
QUOTA_ARTIFACTS = env.integer(
    "QUOTA_ARTIFACTS", 100_000, "artifacts an organization may have stored", minimum=0
)
QUOTA_ARTIFACT_BYTES = env.integer(
    "QUOTA_ARTIFACT_BYTES", 100 * 1024**3, "bytes of artifacts an organization may store",
    minimum=0,
)  # fmt: skip
# A parked `wait` step is a row the wake sweep watches until its time (up to 366 days):
# one more past the quota fails its attempt (quota_exceeded), it does not park.
QUOTA_PARKED_WAITS = env.integer(
    "QUOTA_PARKED_WAITS", 10_000, "wait steps an organization may have parked at once", minimum=0
)
