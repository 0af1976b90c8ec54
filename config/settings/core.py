"""The core of the Django project (docs/configuration.md, "Core" and "Traces"): debug,
the secret key, hosts, apps, middleware and templates, languages and static files, the
security headers, the key of organizations' secrets, logging and the OpenTelemetry
settings."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from cryptography.fernet import Fernet

from config import otel
from config.settings.environment import BASE_DIR, env

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
    "web",
]
# The apps whose database code (each `<app>/sql/*.sql`) is installed after `migrate`, each
# in the schema named for the app, in this order: an app's code may use the code of the
# apps before it (common/database_code.py; docs/engine.md, "Database code").
DATABASE_CODE = ["billing", "runs", "webhooks"]

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
