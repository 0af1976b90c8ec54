"""Fixtures of the web pages' tests: an API tenant, whose requests `GET /metrics` counts."""

from tests.api.conftest import tenant  # noqa: F401
