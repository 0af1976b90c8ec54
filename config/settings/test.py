"""The test suite: `make test` points DATABASE_URL and CELERY_BROKER_URL at throwaway servers."""

import os
import re
import tempfile
from pathlib import Path

from config.settings.checks import check_consistency

from .base import *  # noqa: F403
from .broker import CELERY_BROKER_URL, CELERY_RESULT_BACKEND
from .environment import env

DEBUG = False

# `make test` runs the suite in parallel processes (pytest-xdist: gw0, gw1, ...). Each
# gets its own database (pytest-django's suffix) and here its own Redis database: the
# broker's queues, results, throttling and the workers' control channel, so that one
# process's Celery worker never takes another's messages. Only the URL `make test` gave
# (remembered in ORCHESTRATOR_TEST_REDIS_BASE) is moved; a child process handed another
# URL (a Sentinel, a Redis of its own) or the moved one keeps it. The environment is
# moved too: Celery reads CELERY_BROKER_URL from it before its settings.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if re.fullmatch(r"gw\d+", _xdist_worker):
    _base = os.environ.setdefault("ORCHESTRATOR_TEST_REDIS_BASE", CELERY_BROKER_URL)
    _moved = re.sub(r"/\d+$", f"/{1 + int(_xdist_worker[2:])}", _base)
    if _base == CELERY_BROKER_URL:
        CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"] = _moved
    if _base == CELERY_RESULT_BACKEND:
        CELERY_RESULT_BACKEND = _moved
        if "CELERY_RESULT_BACKEND" in os.environ:
            os.environ["CELERY_RESULT_BACKEND"] = _moved

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed, tests only
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# No collectstatic in tests: WhiteNoise would warn about the missing STATIC_ROOT.
MIDDLEWARE = [m for m in MIDDLEWARE if not m.startswith("whitenoise.")]  # noqa: F405
LOG_FORMAT = "text"
LOGGING["handlers"]["console"]["formatter"] = "text"  # noqa: F405
LOGGING["root"]["level"] = env.string("LOG_LEVEL", "WARNING", "root log level")  # noqa: F405

# Short leases so that crash-recovery tests reclaim within seconds, not minutes.
ENGINE_HEARTBEAT_SECONDS = env.number("ENGINE_HEARTBEAT_SECONDS", 0.5, "lease renewal period")
ENGINE_LEASE_SECONDS = env.number("ENGINE_LEASE_SECONDS", 3, "lease length")

# Most tests drive a run step by step: started (PENDING), then picked up by the test as
# a worker would. Runs that begin in their start's own transaction are tested where
# they are meant to be (tests/runs/test_start_at_once.py and the integration tests that
# turn this on).
ENGINE_START_AT_ONCE_STEPS = env.integer(
    "ENGINE_START_AT_ONCE_STEPS", 0, "steps a plan may have to begin at its start", minimum=0
)

# Artifacts of the tests' runs: one directory every process of the suite shares (the
# worker, the web server, the test process), outside the checkout. Keys are unique, so
# suites running side by side do not meet in it.
ARTIFACTS_ROOT = env.string(
    "ARTIFACTS_ROOT",
    str(Path(tempfile.gettempdir()) / "orchestrator-test-artifacts"),
    "the filesystem backend's directory",
)

# A failing webhook is retried within the test's patience, not minutes later.
ESCALATION_WEBHOOK_BACKOFF = env.number(
    "ESCALATION_WEBHOOK_BACKOFF", 0.2, "seconds before the first webhook retry"
)

# Webhooks: retries, leases and giving up within a test's patience (docs/webhooks.md).
WEBHOOK_TIMEOUT = env.number("WEBHOOK_TIMEOUT", 1, "seconds one delivery's POST may take")
WEBHOOK_LEASE = env.number("WEBHOOK_LEASE", 2, "seconds a claimed delivery is held")
WEBHOOK_BACKOFF = env.number("WEBHOOK_BACKOFF", 0.1, "seconds before a delivery's first retry")
WEBHOOK_BACKOFF_MAX = env.number("WEBHOOK_BACKOFF_MAX", 0.5, "seconds between retries at most")

check_consistency(env, globals())
env.raise_if_invalid()
