"""Admin pieces shared by the apps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdminMixin:
    """For append-only tables (events, ledger): listed and shown, never added,
    changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
