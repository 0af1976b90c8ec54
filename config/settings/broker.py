"""Celery and its Redis broker (docs/configuration.md, "Celery"): what makes delivery
reliable, time limits, the visibility timeout, priorities and Sentinel."""

from __future__ import annotations

from common.stores import celery_sentinel_options, is_sentinel, keepalive_options, parse_sentinel
from config.settings.core import TIME_ZONE
from config.settings.environment import env

# --------------------------------------------------------------------------- Celery
# Reliability: a message is acknowledged only after its task finished, is handed back if
# the worker process dies, and each process holds at most one unacknowledged message, so
# a crash loses nothing and a long task blocks nobody.
redis_schemes = ("redis", "rediss", "sentinel")


def check_redis_urls(broker: str, results: str, master: str) -> None:
    """A sentinel:// URL must name its Sentinels well, and the group needs a name."""
    for name, url in (("CELERY_BROKER_URL", broker), ("CELERY_RESULT_BACKEND", results)):
        if url and is_sentinel(url):
            try:
                parse_sentinel(url)
            except ValueError as exc:
                env.errors.append(f"{name}: {exc}")
            if not master:
                env.errors.append(f"REDIS_SENTINEL_MASTER must be set for {name}'s Sentinels")


CELERY_BROKER_URL = env.url(
    "CELERY_BROKER_URL",
    "redis://127.0.0.1:56379/0",
    "Redis URL of the Celery broker and of every Redis client: redis://, rediss://, or "
    "sentinel://host:port/db;sentinel://host:port/db... (with REDIS_SENTINEL_MASTER)",
    schemes=redis_schemes,
)
CELERY_RESULT_BACKEND = env.url(
    "CELERY_RESULT_BACKEND",
    CELERY_BROKER_URL,
    "Redis URL for Celery results (chord joins); defaults to the broker",
    schemes=redis_schemes,
)
REDIS_SENTINEL_MASTER = env.string(
    "REDIS_SENTINEL_MASTER",
    "orchestrator",
    "the Sentinels' name of the Redis group, for sentinel:// URLs",
)
check_redis_urls(CELERY_BROKER_URL, CELERY_RESULT_BACKEND, REDIS_SENTINEL_MASTER)
CELERY_TIMEZONE = TIME_ZONE
CELERY_ENABLE_UTC = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# After a broker connection loss a running task's acknowledgement cannot be delivered and
# Redis restores its message: cancel it rather than let its redelivery meet it. Celery
# writes a "retry" result when it cancels; the engine's tasks have no result backend
# (common.task_base.EngineTask), or that write, Redis being down, killed the worker.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True  # PostgreSQL holds every outcome; opt in per task.
# Celery's Django fixup closes every database connection before and after each task
# unless told to reuse them, and a new PostgreSQL connection per step costs more than
# the step. Connections are kept (DATABASE_CONN_MAX_AGE) and checked before each task
# instead (config.celery: close_old_connections on task_prerun).
CELERY_DB_REUSE_MAX = 1000

CELERY_RESULT_EXPIRES = env.integer(
    "CELERY_RESULT_EXPIRES", 3600, "seconds Celery keeps task results", minimum=60
)
CELERY_TASK_SOFT_TIME_LIMIT = env.integer(
    "CELERY_TASK_SOFT_TIME_LIMIT", 300, "default soft time limit (s) of a task", minimum=1
)
CELERY_TASK_TIME_LIMIT = env.integer(
    "CELERY_TASK_TIME_LIMIT", 360, "default hard time limit (s) of a task", minimum=1
)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    env.errors.append("CELERY_TASK_TIME_LIMIT must be greater than CELERY_TASK_SOFT_TIME_LIMIT")
# The visibility timeout must outlast the longest step, or Redis hands a message that
# is still being worked on to a second worker.
CELERY_VISIBILITY_TIMEOUT = env.integer(
    "CELERY_VISIBILITY_TIMEOUT",
    7200,
    "seconds before Redis redelivers an unacknowledged message",
    minimum=60,
)
if CELERY_VISIBILITY_TIMEOUT <= CELERY_TASK_TIME_LIMIT:
    env.errors.append("CELERY_VISIBILITY_TIMEOUT must be greater than CELERY_TASK_TIME_LIMIT")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
    # One Redis list per priority 0..9; the worker polls them in ascending order, so a
    # lower number is served first and equal priorities stay FIFO.
    "priority_steps": list(range(10)),
    "sep": ":",
    "queue_order_strategy": "priority",
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    # A consumer blocked on a host that vanished notices within seconds (common.stores).
    **keepalive_options(),
}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT}
CELERY_REDIS_SOCKET_KEEPALIVE = True  # the result backend's (it takes no keepalive timers)
# Through Sentinel, kombu (the broker) and Celery (results) find the primary themselves,
# given the group's name: common.stores, docs/architecture.md "Across hosts".
if is_sentinel(CELERY_BROKER_URL):
    CELERY_BROKER_TRANSPORT_OPTIONS.update(celery_sentinel_options(REDIS_SENTINEL_MASTER, 10))
if is_sentinel(CELERY_RESULT_BACKEND):
    CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS.update(
        celery_sentinel_options(REDIS_SENTINEL_MASTER, 10)
    )
CELERY_TASK_DEFAULT_PRIORITY = 5
CELERY_WORKER_SEND_TASK_EVENTS = env.boolean(
    "CELERY_WORKER_SEND_TASK_EVENTS", True, "emit task events for Flower"
)
CELERY_TASK_SEND_SENT_EVENT = CELERY_WORKER_SEND_TASK_EVENTS
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULER = "orchestrator.beat:TrackingDatabaseScheduler"
# Beat wakes at least this often; each wake-up records a tick that /healthz reads.
CELERY_BEAT_MAX_LOOP_INTERVAL = 5
