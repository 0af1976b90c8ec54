"""Fixtures of the web pages' tests: an API tenant, whose requests `GET /metrics` counts."""

from tests.tenants import tenant  # noqa: F401
