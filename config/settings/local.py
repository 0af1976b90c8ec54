"""Developer machine: `make run` and `manage.py` default to this module."""

from config.settings.checks import check_consistency

from .base import *  # noqa: F403
from .environment import env

DEBUG = env.boolean("DJANGO_DEBUG", True, "Django debug mode; never in production")
# Locally the static files are hashed but not compressed: brotli over the API docs'
# bundles and their source maps took most of a minute of `make run` on 2 cores.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
# A developer's terminal, as make run's processes log: text at WARNING unless LOG_LEVEL and
# LOG_FORMAT say otherwise (a management command's INFO line, a JSON object, on stderr
# beside the JSON it prints, was noise); production's JSON at INFO stays base's default.
LOG_LEVEL = env.string("LOG_LEVEL", "WARNING", "root log level")
LOG_FORMAT = env.string("LOG_FORMAT", "text", "json (one object per line) or text")
LOGGING["root"]["level"] = LOG_LEVEL  # noqa: F405
LOGGING["handlers"]["console"]["formatter"] = LOG_FORMAT  # noqa: F405
FLOWER_BASIC_AUTH = env.string(
    "FLOWER_BASIC_AUTH", "admin:admin", "user:password Flower requires (comma-separate several)"
)

check_consistency(env, globals())
env.raise_if_invalid()
