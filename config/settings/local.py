"""Developer machine: `make run` and `manage.py` default to this module."""

from config.settings.checks import check_consistency

from .base import *  # noqa: F403
from .base import env

DEBUG = env.boolean("DJANGO_DEBUG", True, "Django debug mode; never in production")
# Locally the static files are hashed but not compressed: brotli over the API docs'
# bundles and their source maps took most of a minute of `make run` on 2 cores.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
FLOWER_BASIC_AUTH = env.string(
    "FLOWER_BASIC_AUTH", "admin:admin", "user:password Flower requires (comma-separate several)"
)

check_consistency(env, globals())
env.raise_if_invalid()
