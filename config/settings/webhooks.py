"""Run webhooks (docs/configuration.md, "Run webhooks"; docs/webhooks.md)."""

from __future__ import annotations

from config.settings.environment import env

# Run webhooks (docs/webhooks.md): a delivery per event and endpoint, written by
# PostgreSQL in the state change's transaction, claimed by a sweep that beat sends once
# one is due (it looks every WEBHOOK_SWEEP_INTERVAL s) and sent by a task; retried from
# WEBHOOK_BACKOFF s, doubled up to WEBHOOK_BACKOFF_MAX, with jitter, until
# WEBHOOK_RETRY_WINDOW has passed.
WEBHOOK_TIMEOUT = env.number("WEBHOOK_TIMEOUT", 10, "seconds one delivery's POST may take, in all")
WEBHOOK_MAX_RESPONSE_BYTES = env.integer(
    "WEBHOOK_MAX_RESPONSE_BYTES", 65536, "bytes of a receiver's answer read at most", minimum=0
)
WEBHOOK_BACKOFF = env.number("WEBHOOK_BACKOFF", 5, "seconds before a delivery's first retry")
WEBHOOK_BACKOFF_MAX = env.number(
    "WEBHOOK_BACKOFF_MAX", 3 * 3600, "seconds between two retries at most"
)
WEBHOOK_RETRY_WINDOW = env.number(
    "WEBHOOK_RETRY_WINDOW", 24 * 3600, "seconds a delivery is retried before it is failed"
)
WEBHOOK_LEASE = env.number(
    "WEBHOOK_LEASE", 60, "seconds a claimed delivery is held before it is due again"
)
WEBHOOK_ENDPOINT_CONCURRENCY = env.integer(
    "WEBHOOK_ENDPOINT_CONCURRENCY", 1, "deliveries sent to one endpoint at once", minimum=1
)
WEBHOOK_DISABLE_AFTER = env.number(
    "WEBHOOK_DISABLE_AFTER", 24 * 3600, "seconds an endpoint fails before it is disabled"
)
WEBHOOK_DISABLE_FAILURES = env.integer(
    "WEBHOOK_DISABLE_FAILURES",
    20,
    "attempts in a row an endpoint fails before it is disabled",
    minimum=1,
)
WEBHOOK_SWEEP_INTERVAL = env.integer(
    "WEBHOOK_SWEEP_INTERVAL", 1, "seconds between beat's looks for a due delivery", minimum=1
)
WEBHOOK_SWEEP_BATCH = env.integer(
    "WEBHOOK_SWEEP_BATCH", 200, "deliveries one sweep claims at most", minimum=1
)
WEBHOOK_MAX_PENDING = env.integer(
    "WEBHOOK_MAX_PENDING",
    100,
    "pending deliveries of an endpoint past which a test or a redelivery is refused",
    minimum=1,
)
# Run events are never refused (they are written with the change they announce): an
# endpoint left with more pending than this, its receiver not keeping up, is disabled at
# its next attempt instead, and gets no more until it is enabled again.
WEBHOOK_MAX_BACKLOG = env.integer(
    "WEBHOOK_MAX_BACKLOG",
    10_000,
    "pending deliveries of an endpoint past which it is disabled",
    minimum=1,
)
