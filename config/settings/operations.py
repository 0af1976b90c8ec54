"""What operators run beside the processes (docs/configuration.md, "Operations"): Flower,
the health checks, and how long finished deliveries and fires are kept."""

from __future__ import annotations

from config.settings.environment import env

# --------------------------------------------------------------------------- operations
FLOWER_BASIC_AUTH = env.string(
    "FLOWER_BASIC_AUTH", "", "user:password Flower requires (comma-separate several)"
)
HEALTH_WORKER_PING_TIMEOUT = env.number(
    "HEALTH_WORKER_PING_TIMEOUT", 1.0, "seconds /healthz waits for a worker to answer a ping"
)
HEALTH_BEAT_MAX_AGE = env.integer(
    "HEALTH_BEAT_MAX_AGE", 60, "seconds since beat's last tick before /healthz fails", minimum=5
)
FLOWER_PORT = env.integer("FLOWER_PORT", 5555, "Flower's HTTP port", minimum=1, maximum=65535)
FLOWER_ADDRESS = env.string("FLOWER_ADDRESS", "127.0.0.1", "address Flower listens on")
# Where people reach Flower: the admin dashboard links to it (web/dashboard.py).
# By default where `make run` starts it; set it when Flower is behind a proxy or listens
# on every address (0.0.0.0 is no address to browse to). Not FLOWER_*: Flower takes those
# as its own options (docs/configuration.md).
_FLOWER_HOST = f"[{FLOWER_ADDRESS}]" if ":" in FLOWER_ADDRESS else FLOWER_ADDRESS
DASHBOARD_FLOWER_URL = env.url(
    "DASHBOARD_FLOWER_URL",
    f"http://{_FLOWER_HOST}:{FLOWER_PORT}/",
    "Flower's URL, as operators open it",
    schemes=("http", "https"),
)

# Retention (docs/tenants.md, "Retention"): webhook deliveries (sent or given up) and
# attempts, and schedule fires, older than this are deleted by a beat sweep in small
# batches. Runs, their events and the ledger are kept.
RETENTION_DAYS = env.integer(
    "RETENTION_DAYS", 30, "days webhook deliveries and schedule fires are kept", minimum=1
)
