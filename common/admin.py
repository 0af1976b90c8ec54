"""Admin pieces shared by the apps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def actor_of(request: HttpRequest) -> str:
    """Who acts, as events and the ledger record it: the operator, ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


class ReadOnlyAdminMixin:
    """For append-only tables (events, ledger): listed and shown, never added,
    changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
