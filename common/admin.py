"""Admin pieces shared by the apps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

# How much of a long word (a URL) a list shows; the whole of it is the cell's tooltip.
SHOWN_CHARACTERS = 40


def actor_of(request: HttpRequest) -> str:
    """Who acts, as events and the ledger record it: the operator, ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


def shortened(text: str, width: int = SHOWN_CHARACTERS) -> SafeString | str:
    """``text`` cut to ``width`` characters with an ellipsis, the whole of it as the
    tooltip, and free to wrap anywhere (class ``shortened``, config/templates/admin/
    base_site.html): a URL has no space to wrap at and would widen its list past the
    screen."""
    if len(text) <= width:
        return format_html('<span class="shortened">{}</span>', text)
    return format_html(
        '<span class="shortened" title="{}">{}\u2026</span>', text, text[: width - 1]
    )


class ReadOnlyAdminMixin:
    """For append-only tables (events, ledger): listed and shown, never added,
    changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
