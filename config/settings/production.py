"""Production: the essentials must come from the environment, and HTTPS is enforced.

A missing or malformed required variable stops start-up with a message naming it
(``config.env.Env.raise_if_invalid``).
"""

from config.env import REQUIRED
from config.settings.checks import check_consistency

from .base import *  # noqa: F403
from .broker import check_redis_urls, redis_schemes
from .core import secrets_encryption_keys
from .database import database_config
from .environment import env

DEBUG = False
SECRET_KEY = env.string("SECRET_KEY", REQUIRED, "Django secret key (>= 50 random characters)")
if SECRET_KEY and (len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5):
    env.errors.append("SECRET_KEY must be at least 50 characters with at least 5 distinct ones")
ALLOWED_HOSTS = env.strings("ALLOWED_HOSTS", REQUIRED, "comma-separated host names")
DATABASE_URL = env.url(
    "DATABASE_URL",
    REQUIRED,
    "PostgreSQL URL, postgres://user:password@host:port/name",
    schemes=("postgres", "postgresql", "pgsql"),
)
DATABASES = {"default": database_config(DATABASE_URL)}
CELERY_BROKER_URL = env.url(
    "CELERY_BROKER_URL", REQUIRED, "Redis URL of the Celery broker", schemes=redis_schemes
)
CELERY_RESULT_BACKEND = env.url(
    "CELERY_RESULT_BACKEND",
    CELERY_BROKER_URL,
    "Redis URL for Celery results (chord joins); defaults to the broker",
    schemes=redis_schemes,
)
check_redis_urls(CELERY_BROKER_URL, CELERY_RESULT_BACKEND, REDIS_SENTINEL_MASTER)  # noqa: F405
FLOWER_BASIC_AUTH = env.string(
    "FLOWER_BASIC_AUTH", REQUIRED, "user:password Flower requires (comma-separate several)"
)
if FLOWER_BASIC_AUTH and any(
    ":" not in pair or not pair.split(":", 1)[0] or not pair.split(":", 1)[1]
    for pair in FLOWER_BASIC_AUTH.split(",")
):
    env.errors.append("FLOWER_BASIC_AUTH must be user:password (comma-separate several)")
# Never derived from SECRET_KEY here: rotating SECRET_KEY must not lose every secret.
SECRETS_ENCRYPTION_KEYS = secrets_encryption_keys(
    env.strings(
        "SECRETS_ENCRYPTION_KEYS",
        REQUIRED,
        "comma-separated Fernet keys for secrets; the first encrypts, all decrypt",
    )
)

# HTTPS: the app sits behind a TLS-terminating proxy that sets X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.boolean("SECURE_SSL_REDIRECT", True, "redirect HTTP to HTTPS")
# /healthz is probed over plain HTTP by load balancers inside the private network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.integer(
    "SECURE_HSTS_SECONDS", 31536000, "HSTS max-age in seconds", minimum=0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean(
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", True, "HSTS includeSubDomains"
)
SECURE_HSTS_PRELOAD = env.boolean("SECURE_HSTS_PRELOAD", True, "HSTS preload")

check_consistency(env, globals())
env.raise_if_invalid()
