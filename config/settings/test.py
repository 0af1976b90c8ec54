"""The test suite: `make test` points DATABASE_URL and CELERY_BROKER_URL at throwaway servers."""

import tempfile
from pathlib import Path

from config.settings.checks import check_consistency

from .base import *  # noqa: F403
from .base import env

DEBUG = False
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

check_consistency(env, globals())
env.raise_if_invalid()
