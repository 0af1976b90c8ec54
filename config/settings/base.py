"""Settings shared by every environment.

Every value that can vary between deployments comes from the environment through
``config.env.Env``; the thin ``local``, ``test`` and ``production`` modules only change
defaults and make the production essentials mandatory. docs/configuration.md lists
each variable read here.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from cryptography.fernet import Fernet

from common.stores import (
    celery_sentinel_options,
    is_sentinel,
    keepalive_options,
    parse_sentinel,
    postgres_hosts,
)
from config import otel
from config.env import Env

# Lets classes such as admin.ModelAdmin[Run] be subscripted at run time, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = Env()

# --------------------------------------------------------------------------- core
DEBUG = env.boolean("DJANGO_DEBUG", False, "Django debug mode; never in production")
SECRET_KEY = env.string(
    "SECRET_KEY",
    "insecure-local-development-key-0123456789-abcdefghijklmnopqrstuvwxyz",
    "Django secret key (>= 50 random characters in production)",
)
ALLOWED_HOSTS = env.strings(
    "ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"], "comma-separated host names"
)
CSRF_TRUSTED_ORIGINS = env.strings(
    "CSRF_TRUSTED_ORIGINS", [], "comma-separated origins (https://host) for the admin"
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "orchestrator",
    "runs",
    "billing",
    "ratelimits",
    "artifacts",
    "schedules",
    "webhooks",
    "api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Counts the API's requests for Prometheus (api/metrics.py, into common.metrics).
    "api.metrics.RequestMetrics",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Site-wide overrides of Django's own templates (admin/base_site.html), found
        # before the apps' templates.
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --------------------------------------------------------------------------- database
DATABASE_URL = env.url(
    "DATABASE_URL",
    "postgres://orchestrator@127.0.0.1:55432/orchestrator",
    "PostgreSQL URL, postgres://user:password@host:port/name",
    schemes=("postgres", "postgresql", "pgsql"),
)


def server_session_options() -> dict[str, str]:
    """What the server side of each connection is told at its start (libpq's
    ``options``): a client cut off by the network while it holds row locks in an open
    transaction (a worker host partitioned mid-recording) would otherwise keep them until
    the server's own keepalives notice, two hours by default, and every sweep and
    recording of that run would wait on them. The server drops such a session after
    ``DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S`` idle in a transaction (nothing here idles
    inside one: tools run outside transactions) and probes a silent client like the
    client probes it. Behind PgBouncer in transaction mode (which refuses unknown startup
    parameters), set 0 and put these in postgresql.conf instead."""
    idle = env.integer(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S",
        30,
        "seconds the server lets a session idle inside a transaction (0: send no options)",
        minimum=0,
    )
    if not idle:
        return {}
    settings = {
        "idle_in_transaction_session_timeout": f"{idle}s",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "3",
        "tcp_keepalives_count": "3",
    }
    return {"options": " ".join(f"-c {name}={value}" for name, value in settings.items())}


def database_config(url: str) -> dict[str, Any]:
    # Several hosts (libpq's multi-host form, common.stores): parsed with the first host
    # alone, then libpq gets them all, in order.
    try:
        hosts = postgres_hosts(url)
    except ValueError as exc:
        env.errors.append(str(exc))
        hosts, url = None, ""  # refused above; parsed as a placeholder, never used
    config: dict[str, Any] = dict(
        dj_database_url.parse(
            (hosts.single_url if hosts else url) or "postgres://invalid/invalid",
            conn_max_age=env.integer(
                "DATABASE_CONN_MAX_AGE", 60, "seconds a connection is reused", minimum=0
            ),
            conn_health_checks=True,
        )
    )
    if hosts:
        config["HOST"], config["PORT"] = hosts.host, hosts.port
    # A host that dies without closing its connections (its link down, its machine
    # gone) is noticed in seconds, not after TCP's retransmissions (about 15 minutes):
    # keepalives for an idle connection, tcp_user_timeout for one whose data goes
    # unacknowledged. The URL's own parameters (target_session_attrs, sslmode, ...) win.
    config["OPTIONS"] = {
        "connect_timeout": env.integer(
            "DATABASE_CONNECT_TIMEOUT", 5, "seconds to wait for PostgreSQL", minimum=1
        ),
        "keepalives": 1,
        "keepalives_idle": env.integer(
            "DATABASE_KEEPALIVE_IDLE_S", 10, "idle seconds before TCP keepalives", minimum=1
        ),
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": env.integer(
            "DATABASE_TCP_USER_TIMEOUT_MS",
            15000,
            "ms data may go unacknowledged before the connection is dropped (0: the OS's)",
            minimum=0,
        ),
        **server_session_options(),
        **config.get("OPTIONS", {}),
    }
    # A pool of connections per process (Django's psycopg pool), for the web process:
    # its gevent greenlets each need a connection for the length of a request, and
    # opening one per request halved the API's throughput (config/gunicorn.py).
    pool_size = env.integer(
        "DATABASE_POOL_SIZE", 0, "connections pooled per process (0: no pool)", minimum=0
    )
    if pool_size:
        config["CONN_MAX_AGE"] = 0  # the pool keeps them; Django refuses both
        config["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": pool_size,
            "timeout": 10,
            # psycopg_pool retries a lost connection with a doubling delay for as long as
            # this (its default 300 s): after a 30 s outage its next try came a minute
            # later, every connection of the pool waiting its turn, and requests were
            # answered 503 for minutes once the database was back (make chaos-net,
            # docs/reliability.md). Given up sooner, a connection is opened again by the
            # next request that needs one.
            "reconnect_timeout": env.integer(
                "DATABASE_POOL_RECONNECT_S",
                5,
                "seconds the pool retries a lost connection before leaving it to demand",
                minimum=1,
            ),
        }
    # Prepared statements: the engine's statements are large (data-modifying CTEs) and
    # PostgreSQL spent as long planning them as running them; prepared, a statement is
    # planned once per connection (psycopg prepares a query on its second execution,
    # which needs server-side parameter binding). Measured in docs/benchmark.md.
    if env.boolean(
        "DATABASE_PREPARED_STATEMENTS",
        True,
        "prepare repeated statements (off behind PgBouncer older than 1.21 in transaction mode)",
    ):
        config["OPTIONS"].update(server_side_binding=True, prepare_threshold=1)
    # Nothing else may outlive a transaction on its server connection, so that PgBouncer
    # in transaction mode can hand each transaction a different one (docs/benchmark.md):
    # no server-side cursors (an .iterator() would hold one). Prepared statements are
    # protocol-level (psycopg's Parse/Bind), which PgBouncer 1.21+ tracks across server
    # connections with max_prepared_statements; an older one needs them off.
    config["DISABLE_SERVER_SIDE_CURSORS"] = True
    return config


DATABASES = {"default": database_config(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --------------------------------------------------------------------------- i18n, static
LANGUAGE_CODE = "en-us"
# Dates and times as the admin writes them: ISO-like, each with its zone (config/formats).
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = env.string("STATIC_ROOT", str(BASE_DIR / ".data" / "static"), "collectstatic target")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --------------------------------------------------------------------------- security
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True


# --------------------------------------------------------------------------- secrets
# Organizations' secrets (billing/secrets.py) are stored as Fernet tokens. The first key
# encrypts, every key decrypts: to rotate, put a new key first, keep the old ones until
# `secrets_rotate()` has re-encrypted every row. Without the variable (local, test) the
# key is derived from SECRET_KEY, so changing SECRET_KEY makes existing secrets
# unreadable; production requires it.
def derived_secrets_key(secret_key: str) -> str:
    digest = hashlib.sha256(b"orchestrator-secrets:" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


def secrets_encryption_keys(keys: list[str]) -> list[str]:
    """``keys`` after checking each is a Fernet key; a bad one is reported by position,
    never by value (it is a secret)."""
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            env.errors.append(
                f"SECRETS_ENCRYPTION_KEYS: key {position} is not a Fernet key (32 url-safe "
                "base64-encoded bytes, e.g. from Fernet.generate_key())"
            )
    return keys


SECRETS_ENCRYPTION_KEYS = secrets_encryption_keys(
    env.strings(
        "SECRETS_ENCRYPTION_KEYS",
        [],
        "comma-separated Fernet keys for secrets; the first encrypts, all decrypt",
    )
) or [derived_secrets_key(SECRET_KEY)]

# --------------------------------------------------------------------------- logging
LOG_LEVEL = env.string("LOG_LEVEL", "INFO", "root log level")
LOG_FORMAT = env.string("LOG_FORMAT", "json", "json (one object per line) or text")
if LOG_FORMAT not in {"json", "text"}:
    env.errors.append(f"LOG_FORMAT must be json or text, got {LOG_FORMAT!r}")
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "config.logging.JsonFormatter"},
        "text": {
            "()": "config.logging.TextFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    # The values of the secrets a running step resolved never reach a log line.
    "filters": {"redact_secrets": {"()": "config.logging.RedactSecrets"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["redact_secrets"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own configuration gives its logger a handler of its own with DEBUG on
        # (and INFO as level): every 4xx and 5xx was printed twice, once unformatted.
        # Its records go to the root's handler alone, at the root's level.
        "django": {"handlers": [], "level": "NOTSET"},
        "django.db.backends": {"level": "WARNING"},
    },
}

# --------------------------------------------------------------------------- traces
# OpenTelemetry (docs/observability.md): off unless OTEL_EXPORTER_OTLP_ENDPOINT is set;
# config.otel hands these to the SDK in the web and worker processes.
TRACING = otel.read(env)

# --------------------------------------------------------------------------- Celery
# Reliability settings (SPEC section 5): a message is acknowledged only after its task
# finished, is handed back if the worker process dies, and each process holds at most
# one unacknowledged message, so a crash loses nothing and a long task blocks nobody.
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
# Where people reach Flower: the admin dashboard links to it (orchestrator/dashboard.py).
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

# --------------------------------------------------------------------------- artifacts
# Files runs produce (docs/artifacts.md): on the local filesystem by default, or in any
# S3-compatible store through boto3 (credentials from the usual AWS variables).
ARTIFACTS_BACKEND = env.choice(
    "ARTIFACTS_BACKEND", "filesystem", ("filesystem", "s3"), "where artifacts are stored"
)
ARTIFACTS_ROOT = env.string(
    "ARTIFACTS_ROOT", str(BASE_DIR / ".data" / "artifacts"), "the filesystem backend's directory"
)
ARTIFACTS_S3_BUCKET = env.string("ARTIFACTS_S3_BUCKET", "", "the S3 backend's bucket")
ARTIFACTS_S3_ENDPOINT_URL = env.string(
    "ARTIFACTS_S3_ENDPOINT_URL", "", "an S3-compatible endpoint (empty: AWS)"
)
ARTIFACTS_S3_REGION = env.string("ARTIFACTS_S3_REGION", "us-east-1", "the S3 backend's region")
ARTIFACT_RETENTION_DAYS = env.integer(
    "ARTIFACT_RETENTION_DAYS", 30, "days artifacts are kept after their run ended", minimum=1
)
ARTIFACT_MAX_FILE_BYTES = env.integer(
    "ARTIFACT_MAX_FILE_BYTES", 10 * 1024**3, "largest artifact, bytes", minimum=1
)
ARTIFACT_RUN_MAX_BYTES = env.integer(
    "ARTIFACT_RUN_MAX_BYTES", 10 * 1024**3, "most artifact bytes one run may hold", minimum=1
)
ARTIFACT_MAX_IN_FLIGHT = env.integer(
    "ARTIFACT_MAX_IN_FLIGHT", 10, "uploads one run may have in flight at once", minimum=1
)
# A presigned upload's URLs last this long; an upload not completed by then is
# abandoned, and the sweep removes it.
ARTIFACT_UPLOAD_SECONDS = env.integer(
    "ARTIFACT_UPLOAD_SECONDS", 3600, "seconds a presigned upload stays open", minimum=60
)
ARTIFACT_DOWNLOAD_URL_SECONDS = env.integer(
    "ARTIFACT_DOWNLOAD_URL_SECONDS", 900, "seconds a download URL lasts", minimum=1, maximum=900
)
# S3 takes at most 5 GB in one PUT: larger presigned uploads are multipart, in parts of
# ARTIFACT_MULTIPART_PART_SIZE (S3's minimum is 5 MiB).
ARTIFACT_MULTIPART_THRESHOLD = env.integer(
    "ARTIFACT_MULTIPART_THRESHOLD", 5 * 1000**3, "bytes above which uploads are multipart"
)
ARTIFACT_MULTIPART_PART_SIZE = env.integer(
    "ARTIFACT_MULTIPART_PART_SIZE", 512 * 1024**2, "bytes per multipart part", minimum=5 * 1024**2
)
ARTIFACT_SWEEP_BATCH = 500

# --------------------------------------------------------------------------- waits
# Child runs, callbacks and polls (docs/runners.md, "Child runs" and "Asynchronous
# steps"). A run started by a `run` step is one level deeper than its parent (the top run
# is at depth 0); one that would be deeper than RUN_MAX_DEPTH fails its step with
# run_depth_exceeded. A callback URL is PUBLIC_BASE_URL/api/v1/callbacks/<token>. A
# child's end or a poll message lost with the broker is acted on by the wait sweep once
# WAIT_LOST_AFTER has passed.
RUN_MAX_DEPTH = env.integer(
    "RUN_MAX_DEPTH", 5, "deepest a child run may nest (the top run is 0)", minimum=0, maximum=20
)
# By default the web `make run` and the Procfile start, on WEB_PORT: a web moved to another
# port is still the one callback URLs and webhook links name.
WEB_PORT = env.integer(
    "WEB_PORT", 8000, "the web's port (Procfile, make run)", minimum=1, maximum=65535
)
PUBLIC_BASE_URL = env.string(
    "PUBLIC_BASE_URL",
    f"http://127.0.0.1:{WEB_PORT}",
    "the API's address as others reach it, for callback URLs and webhook links",
).rstrip("/")
WAIT_LOST_AFTER = env.integer(
    "WAIT_LOST_AFTER", 30, "seconds before the sweep re-sends a lost poll or child end", minimum=1
)
CALLBACK_MAX_TIMEOUT = 30 * 24 * 3600
POLL_MIN_INTERVAL = 0.05

# --------------------------------------------------------------------------- schedules
# Run schedules (docs/schedules.md): beat looks for the earliest due time every
# SCHEDULES_TICK_SECONDS (orchestrator/periodic.py) and publishes a tick when it comes,
# which fires the schedules that are due. A due time the tick reaches more than
# SCHEDULES_MISFIRE_GRACE seconds late counts as missed (beat was down), and is run or
# not by the schedule's `catchup` policy; `catchup: all` runs at most
# SCHEDULES_CATCHUP_MAX of the missed times, the latest ones.
SCHEDULES_TICK_SECONDS = env.integer(
    "SCHEDULES_TICK_SECONDS", 1, "seconds between beat's looks for a due schedule", minimum=1
)
SCHEDULES_MISFIRE_GRACE = env.integer(
    "SCHEDULES_MISFIRE_GRACE", 60, "seconds late a due time may fire before it is missed",
    minimum=1,
)  # fmt: skip
SCHEDULES_CATCHUP_MAX = env.integer(
    "SCHEDULES_CATCHUP_MAX", 100, "most missed due times `catchup: all` runs at once", minimum=1
)
# One tick handles at most SCHEDULES_TICK_MAX due schedules, organizations in turn; the
# rest are the next tick's (beat looks again every SCHEDULES_TICK_SECONDS).
SCHEDULES_TICK_MAX = env.integer(
    "SCHEDULES_TICK_MAX", 200, "most due schedules one tick handles", minimum=1
)
SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS = env.integer(
    "SCHEDULES_PAUSE_AFTER_CREDIT_REFUSALS",
    10,
    "due times refused for credits in a row after which a schedule pauses itself",
    minimum=1,
)

# --------------------------------------------------------------------------- run plans
# Size limits of a submitted plan (runs/plan/): beyond them it is refused, whole.
ORCHESTRATOR_PLAN_LIMITS = {
    "max_spec_bytes": env.integer(
        "PLAN_MAX_BYTES", 1_000_000, "largest accepted plan, bytes of JSON", minimum=1000
    ),
    "max_agents": env.integer("PLAN_MAX_AGENTS", 100, "agents per run", minimum=1),
    "max_tasks_per_agent": env.integer(
        "PLAN_MAX_TASKS_PER_AGENT", 5000, "tasks per agent", minimum=1
    ),
    "max_steps_per_task": env.integer("PLAN_MAX_STEPS_PER_TASK", 5000, "steps per task", minimum=1),
    "max_steps_per_run": env.integer("PLAN_MAX_STEPS_PER_RUN", 20000, "steps per run", minimum=1),
    "max_on_error": 5,
    # A child run's plan may be written inside its parent's, RUN_MAX_DEPTH levels deep:
    # each level is 8 levels of JSON (plan, agents, agent, tasks, task, steps, step,
    # params) above the 32 a plan may use.
    "max_json_depth": 32 + 8 * RUN_MAX_DEPTH,
    "max_variables_bytes": 100_000,
    "max_retry_attempts": 20,
    "max_step_timeout_ms": env.integer(
        "PLAN_MAX_STEP_TIMEOUT", 3600, "longest step timeout a plan may ask, seconds", minimum=1
    )
    * 1000,
}

# --------------------------------------------------------------------------- billing
# Price of one step attempt per tool, in credits; a run without `credits` in its plan
# reserves the sum over its steps of price x max_attempts (handlers included), at least
# BILLING_MIN_RESERVATION. LLM steps are charged by tokens instead (price per 1k tokens)
# and reserve BILLING_LLM_ESTIMATE each.
BILLING_TOOL_PRICES = {
    "noop": "0.01",
    "echo": "0.01",
    "sleep": "0.01",
    # A durable wait is priced by the day it holds (BILLING_WAIT_PRICE_PER_DAY), not here.
    "wait": "0.00",
    "fail": "0.01",
    "http": "0.10",
    "python": "0.05",
    "llm": "0.00",
    "approval": "0.00",
    "runner": "0.50",
    "run": "0.00",
}
BILLING_DEFAULT_TOOL_PRICE = "0.01"
BILLING_LLM_PRICE_PER_1K_TOKENS = env.string(
    "BILLING_LLM_PRICE_PER_1K_TOKENS", "0.02", "credits charged per 1,000 LLM tokens"
)
BILLING_LLM_ESTIMATE = env.string(
    "BILLING_LLM_ESTIMATE", "5", "credits reserved per LLM step when the plan gives no credits"
)
BILLING_MIN_RESERVATION = "0.01"
# A `wait` step's time held: charged when it parks, per started day of its wait
# (docs/api.md, "Waits"); what a plan reserves for it is that of its longest wait.
BILLING_WAIT_PRICE_PER_DAY = env.string(
    "BILLING_WAIT_PRICE_PER_DAY", "0.01", "credits charged per started day a wait step holds"
)

# --------------------------------------------------------------------------- engine
# Step leases: a running step's lease is renewed every ENGINE_HEARTBEAT_SECONDS; a sweep
# reclaims steps whose lease expired (ENGINE_LEASE_SECONDS without renewal), at most
# ENGINE_MAX_RECLAIMS times, then fails them with `worker_lost`.
ENGINE_HEARTBEAT_SECONDS = env.number(
    "ENGINE_HEARTBEAT_SECONDS", 20, "how often a running step renews its lease"
)
ENGINE_LEASE_SECONDS = env.number(
    "ENGINE_LEASE_SECONDS", 60, "a step lease not renewed for this long is reclaimed"
)
# Seconds between a step's soft time limit (the tool is interrupted, the attempt fails
# with `timeout`) and the hard one (the process is killed).
ENGINE_HARD_LIMIT_GRACE = 10
ENGINE_MAX_RECLAIMS = env.integer(
    "ENGINE_MAX_RECLAIMS", 3, "reclaims before worker_lost", minimum=0
)
ENGINE_DEFAULT_STEP_TIMEOUT = env.number(
    "ENGINE_DEFAULT_STEP_TIMEOUT", 30, "seconds a step may run when its plan sets no timeout"
)
# Rate limits (docs/rate-limits.md): a step that waited for its units and is claimed
# this long after its reserved moment (every slot was busy, its run was paused) asks
# again: units used long after their grant could bunch up calls beyond the limit.
RATE_LIMIT_LATE_S = env.number(
    "RATE_LIMIT_LATE_S", 2, "seconds a rate-limited step may start after its reserved moment"
)
# A step that arrives ahead of steps already waiting re-plans at most this many of them,
# the back of the line: the cost of one step's ask stays bounded however long the line.
RATE_LIMIT_REPLAN_MAX = env.integer(
    "RATE_LIMIT_REPLAN_MAX", 200, "most waiting steps one ask re-plans", minimum=1
)
# The step-message horizon: no step message waits in the broker longer than this. A step
# due later (a timer of days, a rate limit's reservation, a long backoff) has no message
# at all: it is `asleep`, and the wake sweep sends its message, with the exact countdown,
# once its time comes within this horizon (runs.engine.dispatch.wake_asleep). Never one
# countdown that Redis would deliver again every visibility timeout while a worker holds it.
RATE_LIMIT_MAX_COUNTDOWN_S = env.integer(
    "RATE_LIMIT_MAX_COUNTDOWN_S",
    300,
    "longest countdown (s) of a step message; a step due later is woken by the wake sweep",
    minimum=1,
)
# A worker holds a step message unacknowledged through its countdown and then its run.
if RATE_LIMIT_MAX_COUNTDOWN_S + CELERY_TASK_TIME_LIMIT >= CELERY_VISIBILITY_TIMEOUT:
    env.errors.append(
        "RATE_LIMIT_MAX_COUNTDOWN_S + CELERY_TASK_TIME_LIMIT must be less than "
        "CELERY_VISIBILITY_TIMEOUT"
    )
# Beat looks for the work of the lease, timeout, runner and wait sweeps this often, and
# sends each when its work is due (orchestrator/periodic.py).
ENGINE_SWEEP_INTERVAL = env.integer(
    "ENGINE_SWEEP_INTERVAL", 15, "seconds between beat's looks for the sweeps' work", minimum=1
)
ENGINE_SWEEP_BATCH = env.integer(
    "ENGINE_SWEEP_BATCH", 500, "rows a sweep handles per run", minimum=1
)
# Doorbells (orchestrator.transport): the steps of a run that are ready to start are rows
# that a worker claims one after another (runs.transitions.claim_next_step); the broker
# carries doorbells, at most ENGINE_DOORBELLS per run per transaction, not one message
# per step. A doorbell serves its run for at most ENGINE_BURST_STEPS steps or
# ENGINE_BURST_SECONDS, then rings again at the back of the queue, so that other runs'
# work gets its turn. ENGINE_DOORBELLS=0 sends one message per step instead.
ENGINE_DOORBELLS = env.integer(
    "ENGINE_DOORBELLS",
    8,
    "doorbells sent per run for its ready steps (0: one message per step)",
    minimum=0,
)
ENGINE_BURST_STEPS = env.integer(
    "ENGINE_BURST_STEPS", 200, "steps a doorbell serves before ringing again", minimum=1
)
ENGINE_BURST_SECONDS = env.number(
    "ENGINE_BURST_SECONDS", 1.0, "seconds a doorbell serves its run before ringing again"
)
# Batches (docs/engine.md, "Batches"): a server whose last step was short claims up to
# ENGINE_CLAIM_BATCH of its run's next steps with the recording, and runs them in turn;
# those still waiting ENGINE_CLAIM_BATCH_HOLD_SECONDS after the claim are handed back.
ENGINE_CLAIM_BATCH = env.integer(
    "ENGINE_CLAIM_BATCH", 8, "steps a server may claim at once (1: one at a time)", minimum=1
)
ENGINE_CLAIM_BATCH_HOLD_SECONDS = env.number(
    "ENGINE_CLAIM_BATCH_HOLD_SECONDS",
    1.0,
    "seconds a batch's steps may wait for their start before they are handed back",
)
# Runs with a priority at or below this number go to runs.high_priority.
# A run admitted at its start whose plan has at most this many steps begins in the
# start's own transaction (RUNNING, its first steps claimable at commit) instead of
# waiting for a worker's pick-up; a bigger plan is materialised by a worker, so that a
# web process and the organization's admission lock are not held for long. 0: every run
# is picked up by a worker.
ENGINE_START_AT_ONCE_STEPS = env.integer(
    "ENGINE_START_AT_ONCE_STEPS",
    200,
    "steps a plan may have to begin in its start's own transaction",
    minimum=0,
)
ENGINE_HIGH_PRIORITY_MAX = env.integer(
    "ENGINE_HIGH_PRIORITY_MAX", 2, "priorities 0..N use runs.high_priority", minimum=0, maximum=9
)

# --------------------------------------------------------------------------- tools
HTTP_TOOL_MAX_RESPONSE_BYTES = env.integer(
    "HTTP_TOOL_MAX_RESPONSE_BYTES", 1_000_000, "largest response body the http tool keeps"
)
# The http tool refuses loopback, private, link-local, multicast and reserved addresses
# (orchestrator/netguard.py); these networks are let through. Empty everywhere by default.
HTTP_TOOL_ALLOWED_NETWORKS = env.strings(
    "HTTP_TOOL_ALLOWED_NETWORKS",
    [],
    "comma-separated CIDRs the http tool may reach although private (e.g. 10.1.2.0/24)",
)
for _cidr in HTTP_TOOL_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_cidr, strict=False)
    except ValueError:
        env.errors.append(f"HTTP_TOOL_ALLOWED_NETWORKS: {_cidr!r} is not a network (CIDR)")
PYTHON_TOOL_ALLOWLIST = env.strings(
    "PYTHON_TOOL_ALLOWLIST",
    ["orchestrator.tools.examples.add", "orchestrator.tools.examples.word_count"],
    "dotted paths the python tool may call",
)
# Published tools on the fleet (docs/tools.md): the packages whose tools the workers load
# at start, by entry-point or distribution name under the group `orchestrator.tools`;
# `*` for every one installed, empty for none.
ORCHESTRATOR_TOOL_PACKAGES = env.strings(
    "ORCHESTRATOR_TOOL_PACKAGES",
    ["*"],
    "packages whose @tool functions the workers load (entry points orchestrator.tools; * all)",
)
LLM_BASE_URL = env.string("LLM_BASE_URL", "", "OpenAI-compatible API base URL (…/v1)")
LLM_API_KEY = env.string("LLM_API_KEY", "", "bearer key for the LLM API")
LLM_MODEL = env.string("LLM_MODEL", "gpt-4o-mini", "default model of the llm tool")
LLM_TIMEOUT = env.number("LLM_TIMEOUT", 60, "seconds an LLM call may take")
# Publishing engine messages can be switched off (tests that exercise services without a
# worker); the database then holds the work and the lost-message sweep would send it.
ORCHESTRATOR_DISPATCH_ENABLED = True

# --------------------------------------------------------------------------- runners
# The runner protocol (docs/runners.md). A runner long-polls for jobs, holding a poll for
# up to RUNNER_POLL_TIMEOUT seconds, and heartbeats every RUNNER_HEARTBEAT_INTERVAL; one
# silent for RUNNER_STALE_AFTER is stale: its jobs are recovered (runner_lost) and its
# identity may register again. A job no runner claims within its match timeout fails
# its step with no_matching_runner.
RUNNER_POLL_TIMEOUT = env.integer(
    "RUNNER_POLL_TIMEOUT", 30, "longest a runner's poll is held, seconds", minimum=0, maximum=30
)
RUNNER_HEARTBEAT_INTERVAL = env.integer(
    "RUNNER_HEARTBEAT_INTERVAL", 60, "seconds between a runner's heartbeats", minimum=1
)
RUNNER_STALE_AFTER = env.integer(
    "RUNNER_STALE_AFTER", 120, "seconds without a heartbeat before a runner is stale", minimum=1
)
RUNNER_MATCH_TIMEOUT = env.integer(
    "RUNNER_MATCH_TIMEOUT", 300, "seconds a runner job may wait for a runner", minimum=1
)

# --------------------------------------------------------------------------- timeouts
# Defaults for every timed state and level (SPEC section 5); a plan's `timeouts` override
# them per run. Seconds.
RUN_TIMEOUT_DEFAULTS = {
    "run": env.integer("TIMEOUT_RUN", 24 * 3600, "seconds a run may be RUNNING", minimum=1),
    "agent": env.integer("TIMEOUT_AGENT", 6 * 3600, "seconds an agent may run", minimum=1),
    "task": env.integer("TIMEOUT_TASK", 3600, "seconds a task may run", minimum=1),
    "step": int(ENGINE_DEFAULT_STEP_TIMEOUT),
    "pending": env.integer(
        "TIMEOUT_PENDING", 24 * 3600, "seconds a run may wait PENDING", minimum=1
    ),
    "paused": env.integer(
        "TIMEOUT_PAUSED", 7 * 24 * 3600, "seconds a run may stay PAUSED", minimum=1
    ),
    "resuming": env.integer("TIMEOUT_RESUMING", 300, "seconds a run may stay RESUMING", minimum=1),
    "retrying": env.integer(
        "TIMEOUT_RETRYING", 24 * 3600, "seconds a run may stay RETRYING", minimum=1
    ),
    # An escalated run waits this long for a person, then fails with escalation_timeout.
    "escalated": env.integer(
        "TIMEOUT_ESCALATED", 24 * 3600, "seconds a run may stay ESCALATED", minimum=1
    ),
    # A run never started costs nothing and counts against no limit: it is cancelled
    # after this long (created_timeout), and its artifacts then expire like any ended
    # run's. The server's bound, not the client's: no plan's `timeouts` changes it.
    "created": env.integer(
        "CREATED_RUN_TTL", 7 * 24 * 3600, "seconds a run may stay CREATED", minimum=1
    ),
}
# A step dispatched, pending and due for this long without being claimed lost its message.
ENGINE_LOST_MESSAGE_AFTER = env.integer(
    "ENGINE_LOST_MESSAGE_AFTER", 120, "seconds before an unclaimed due step is re-sent", minimum=1
)
# --------------------------------------------------------------------------- fairness
# Sharing one fleet between organizations (docs/fairness.md). Each limit is a default an
# organization's own (set in the admin) overrides. Runs beyond the running limit wait
# PENDING (never refused); beyond the pending limit a start is refused (429).
ORG_MAX_RUNNING_RUNS = env.integer(
    "ORG_MAX_RUNNING_RUNS", 1000, "runs an organization may have running at once", minimum=1
)
ORG_MAX_RUNNING_STEPS = env.integer(
    "ORG_MAX_RUNNING_STEPS", 1000, "steps an organization may have executing at once",
    minimum=1,
)  # fmt: skip
ORG_MAX_PENDING_RUNS = env.integer(
    "ORG_MAX_PENDING_RUNS", 10_000, "runs an organization may have waiting to start", minimum=1
)
# Fair dispatch: a worker serving steps looks every ENGINE_FAIR_SLICE seconds for the
# organization with the fewest steps executing (then the longest unserved). Off serves
# each doorbell's own run, as before fair dispatch: for measuring it only.
ENGINE_FAIR_DISPATCH = env.boolean(
    "ENGINE_FAIR_DISPATCH", True, "share the workers fairly between organizations"
)
ENGINE_FAIR_SLICE = env.number(
    "ENGINE_FAIR_SLICE", 0.02, "seconds a worker serves a run before it looks again"
)

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

# --------------------------------------------------------------------------- escalation
# The engine's policy layer (docs/escalation.md): when a failing run goes to people
# (ESCALATED, a ticket, on-call notified) and when it is re-planned. Each threshold is a
# default a plan's `escalation` and `replan` may override per run.
ESCALATION_WINDOW = env.integer(
    "ESCALATION_WINDOW", 300, "seconds of failures an escalation trigger looks back", minimum=1
)
ESCALATION_MAX_ERRORS = env.integer(
    "ESCALATION_MAX_ERRORS", 5, "failed attempts in the window beyond which a run escalates",
    minimum=0,
)  # fmt: skip
ESCALATION_MAX_ERROR_RATE = env.number(
    "ESCALATION_MAX_ERROR_RATE", 0.5, "failed/all attempts in the window beyond which it escalates"
)
ESCALATION_MIN_ATTEMPTS = env.integer(
    "ESCALATION_MIN_ATTEMPTS", 10, "attempts the window must hold before the rate counts",
    minimum=1,
)  # fmt: skip
if not 0 <= ESCALATION_MAX_ERROR_RATE <= 1:
    env.errors.append(
        f"ESCALATION_MAX_ERROR_RATE must be from 0 to 1, got {ESCALATION_MAX_ERROR_RATE}"
    )
# Notifications: a webhook per organization, retried with exponential backoff from
# ESCALATION_WEBHOOK_BACKOFF seconds, at most ESCALATION_WEBHOOK_ATTEMPTS deliveries;
# e-mail through Django's backend (the console by default) to the on-call addresses.
ESCALATION_WEBHOOK_ATTEMPTS = env.integer(
    "ESCALATION_WEBHOOK_ATTEMPTS", 6, "deliveries of an escalation webhook", minimum=1
)
ESCALATION_WEBHOOK_BACKOFF = env.number(
    "ESCALATION_WEBHOOK_BACKOFF", 10, "seconds before the first webhook retry (then doubled)"
)
ESCALATION_WEBHOOK_TIMEOUT = env.number(
    "ESCALATION_WEBHOOK_TIMEOUT", 10, "seconds a webhook delivery may take"
)

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
EMAIL_BACKEND = env.string(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend",
    "Django e-mail backend for on-call notices",
)
EMAIL_HOST = env.string("EMAIL_HOST", "localhost", "SMTP host (smtp backend)")
EMAIL_PORT = env.integer("EMAIL_PORT", 25, "SMTP port", minimum=1, maximum=65535)
EMAIL_HOST_USER = env.string("EMAIL_HOST_USER", "", "SMTP user")
EMAIL_HOST_PASSWORD = env.string("EMAIL_HOST_PASSWORD", "", "SMTP password")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS", False, "SMTP STARTTLS")
DEFAULT_FROM_EMAIL = env.string(
    "DEFAULT_FROM_EMAIL", "orchestrator@localhost", "sender of on-call notices"
)

# Retention (docs/tenants.md, "Retention"): webhook deliveries (sent or given up) and
# attempts, and schedule fires, older than this are deleted by a beat sweep in small
# batches. Runs, their events and the ledger are kept.
RETENTION_DAYS = env.integer(
    "RETENTION_DAYS", 30, "days webhook deliveries and schedule fires are kept", minimum=1
)

# Re-plan: when more than REPLAN_AGENT_FAILURE_RATIO of a running run's agents failed, or
# more than REPLAN_TASK_FAILURES of its tasks, a planner proposes new agents, at most
# REPLAN_MAX times per run. Planners are callables by dotted path; a plan picks one by
# name (`replan.planner`), ORCH_PLANNER when it does not.
REPLAN_AGENT_FAILURE_RATIO = env.number(
    "REPLAN_AGENT_FAILURE_RATIO", 0.5, "failed/all agents beyond which a running run re-plans"
)
REPLAN_TASK_FAILURES = env.integer(
    "REPLAN_TASK_FAILURES", 10, "failed tasks beyond which a running run re-plans", minimum=0
)
REPLAN_MAX = env.integer("REPLAN_MAX", 2, "re-plans a run may make", minimum=0)
ORCH_PLANNERS: dict[str, str] = {
    "rules": "runs.planners.rule_planner",
    "llm": "orchestrator.llm_planner.llm_planner",
}
for _entry in env.strings(
    "ORCH_PLANNERS", [], "more planners a plan may name: name=dotted.path,name=dotted.path"
):
    _name, _, _path = _entry.partition("=")
    if not _name.strip() or not _path.strip():
        env.errors.append(f"ORCH_PLANNERS: {_entry!r} is not name=dotted.path")
    else:
        ORCH_PLANNERS[_name.strip()] = _path.strip()
ORCH_PLANNER = env.string("ORCH_PLANNER", "rules", "the planner of plans that name none")
if ORCH_PLANNER not in ORCH_PLANNERS:
    env.errors.append(f"ORCH_PLANNER {ORCH_PLANNER!r} is not one of {', '.join(ORCH_PLANNERS)}")
ORCH_PLANNER_TIMEOUT = env.number(
    "ORCH_PLANNER_TIMEOUT", 60, "seconds a planner (an LLM call) may take"
)
if not 0 <= REPLAN_AGENT_FAILURE_RATIO <= 1:
    env.errors.append(
        f"REPLAN_AGENT_FAILURE_RATIO must be from 0 to 1, got {REPLAN_AGENT_FAILURE_RATIO}"
    )

# --------------------------------------------------------------------------- REST API
# (the API block: owned by the API; see api/ and docs/api.md). Every API view is
# authenticated by API key, throttled per key and answers errors as {code, message,
# details} unless it says otherwise.
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "api.permissions.ScopePermission",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.ApiKeyRateThrottle"],
    "EXCEPTION_HANDLER": "api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.PublicAutoSchema",
}
API_THROTTLE_RATE = env.string(
    "API_THROTTLE_RATE", "1200/min", "requests per API key (n/sec|min|hour|day)"
)
_rate_count, _, _rate_period = API_THROTTLE_RATE.partition("/")
if (
    not _rate_count.isdigit()
    or int(_rate_count) < 1
    or _rate_period not in ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")
):
    env.errors.append(f"API_THROTTLE_RATE must look like 1200/min, got {API_THROTTLE_RATE!r}")
API_MAX_BODY_BYTES = env.integer(
    "API_MAX_BODY_BYTES", 2_000_000, "largest accepted request body, bytes", minimum=1000
)
API_PAGE_SIZE = env.integer("API_PAGE_SIZE", 50, "default page size", minimum=1)
API_MAX_PAGE_SIZE = env.integer(
    "API_MAX_PAGE_SIZE", 500, "largest page size a client may ask", minimum=1
)
# A run's event stream (api/streams.py) sends a comment this often, in seconds, so that
# proxies and clients see a live connection, and reads PostgreSQL again each time (a
# wake-up lost with Redis is then late by this much at most).
API_STREAM_HEARTBEAT_S = env.number(
    "API_STREAM_HEARTBEAT_S", 15, "seconds between an event stream's keep-alive comments"
)
if not 0 < API_STREAM_HEARTBEAT_S <= 300:
    env.errors.append(f"API_STREAM_HEARTBEAT_S must be in (0, 300], got {API_STREAM_HEARTBEAT_S}")
# A write of an event stream (its events, a keep-alive) must be taken by the client
# within this many seconds, or the stream is dropped and its place freed: a client that
# stops reading would otherwise hold its connection, and its place, for good.
API_STREAM_SEND_TIMEOUT_S = env.number(
    "API_STREAM_SEND_TIMEOUT_S", 10, "seconds a client may take to accept one write of a stream"
)
if not 0 < API_STREAM_SEND_TIMEOUT_S <= 300:
    env.errors.append(
        f"API_STREAM_SEND_TIMEOUT_S must be in (0, 300], got {API_STREAM_SEND_TIMEOUT_S}"
    )
IDEMPOTENCY_TTL_HOURS = env.integer(
    "IDEMPOTENCY_TTL_HOURS", 24, "hours an Idempotency-Key response is kept", minimum=1
)
# Prometheus (`GET /metrics`, orchestrator/prometheus.py): it answers only to this bearer
# token; unset, the endpoint does not exist. `make run` generates one into .data/metrics-token.
METRICS_TOKEN = env.string(
    "METRICS_TOKEN", "", "bearer token /metrics answers to; empty: no /metrics (404)"
)
SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Run orchestrator API",
    "DESCRIPTION": (
        "Create, start, watch and control runs; read your balance and ledger. "
        "Authenticate with `Authorization: Bearer <api key>`. Errors are "
        "`{code, message, details}`; every POST accepts an `Idempotency-Key`. "
        "See docs/api.md."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs pages' scripts from our static files (drf_spectacular_sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The schema and its docs page are public (they describe, they do not expose data).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.states.RunStatus",
        "NodeStatusEnum": "runs.states.NodeStatus",
        "StepStatusEnum": "runs.states.StepStatus",
        "ModeEnum": "runs.models.Mode",
        "FailureModeEnum": "runs.models.FailureMode",
        "ScheduleStatusEnum": "schedules.models.ScheduleStatus",
        "FireStatusEnum": "schedules.models.FireStatus",
        "CallbackStatusEnum": "api.callbacks.CALLBACK_STATUSES",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.strict_request_bodies",
    ],
}
